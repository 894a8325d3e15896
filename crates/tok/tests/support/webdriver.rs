//! A headless Chromium for the dashboard's tests, driven over WebDriver:
//! Debian's `chromium` and `chromium-driver`, spoken to with plain HTTP
//! (reqwest, which the tests already build) instead of a WebDriver crate
//! with an HTTP stack of its own. The few commands the tests need are here.
//!
//! There is no silent skip: without the packages the tests fail and say
//! how to install them.
#![allow(dead_code)]

use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

const INSTALL: &str = "the dashboard's browser tests need Debian's chromium and chromium-driver: \
     run `apt-get install -y chromium chromium-driver` (.ci/run does)";

/// How long a wait for the page looks before the test fails; a passing
/// test never waits this long.
const PATIENCE: Duration = Duration::from_secs(30);

/// A chromedriver process and one browser session; both end when dropped.
pub(crate) struct Browser {
    driver: Child,
    http: reqwest::Client,
    session: String,
    base: String,
}

/// An element the page showed.
pub(crate) struct Element<'a> {
    browser: &'a Browser,
    id: String,
}

/// A found element's id: the one value of the W3C element reference
/// (`{"element-6066-…": id}`).
fn element_id(reference: &Value) -> String {
    let id = reference.as_object().and_then(|o| o.values().next());
    id.and_then(Value::as_str)
        .unwrap_or_else(|| panic!("not an element reference: {reference}"))
        .to_owned()
}

fn binary(name: &str) -> String {
    let found = ["/usr/bin", "/usr/local/bin", "/usr/lib/chromium"]
        .iter()
        .map(|dir| format!("{dir}/{name}"))
        .find(|path| std::path::Path::new(path).exists());
    found.unwrap_or_else(|| panic!("`{name}` is not installed: {INSTALL}"))
}

impl Browser {
    /// Starts chromedriver and a headless Chromium with a laptop's window.
    pub(crate) async fn start() -> Browser {
        let chromium = binary("chromium");
        let chromedriver = binary("chromedriver");
        let port = super::free_port();
        // A process group of its own: the browsers it starts end with it.
        let driver = Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("could not start chromedriver ({e}): {INSTALL}"));
        let http = reqwest::Client::new();
        let base = format!("http://127.0.0.1:{port}");
        let mut browser = Browser {
            driver,
            http,
            session: String::new(),
            base,
        };
        for _ in 0..200 {
            if let Ok(r) = browser
                .http
                .get(format!("{}/status", browser.base))
                .send()
                .await
                && r.status().is_success()
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let capabilities = json!({ "capabilities": { "alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1440,900",
                         "--no-first-run", "--password-store=basic"]
            }
        }}});
        let created = browser.command("POST", "/session", capabilities).await;
        browser.session = created["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("chromedriver started no session: {created}"))
            .to_owned();
        browser
    }

    async fn command(&self, method: &str, path: &str, body: Value) -> Value {
        match self.try_command(method, path, body).await {
            Ok(answer) => answer,
            Err(error) => panic!("WebDriver {path}: {error}"),
        }
    }

    /// A command whose WebDriver error (`{"error", "message"}`) is returned.
    async fn try_command(&self, method: &str, path: &str, body: Value) -> Result<Value, Value> {
        let url = if path == "/session" {
            format!("{}/session", self.base)
        } else {
            format!("{}/session/{}{path}", self.base, self.session)
        };
        let request = match method {
            "GET" => self.http.get(url),
            "DELETE" => self.http.delete(url),
            _ => self.http.post(url).json(&body),
        };
        let response = request
            .send()
            .await
            .unwrap_or_else(|e| panic!("chromedriver did not answer {path}: {e}"));
        let answer: Value = response.json().await.unwrap();
        if answer["value"]["error"].is_string() {
            return Err(answer["value"].clone());
        }
        Ok(answer)
    }

    /// Clicks what `css` finds. The page is live: when it drew the element
    /// again between finding and clicking, the new one is clicked, as a
    /// person would.
    pub(crate) async fn click(&self, css: &str) {
        for _ in 0..20 {
            let element = self.find(css).await;
            let path = format!("/element/{}/click", element.id);
            match self.try_command("POST", &path, json!({})).await {
                Ok(_) => return,
                Err(e) if e["error"] == "stale element reference" => continue,
                Err(e) => panic!("WebDriver click on `{css}`: {e}"),
            }
        }
        panic!("`{css}` was drawn again on every one of 20 clicks");
    }

    pub(crate) async fn open(&self, url: &str) {
        self.command("POST", "/url", json!({ "url": url })).await;
    }

    /// Signs in to the dashboard at `base` with `key` and waits until its
    /// live stream is on.
    pub(crate) async fn sign_in(&self, base: &str, key: &str) {
        self.open(&format!("{base}/")).await;
        self.find("#signin-key").await.type_text(key).await;
        self.click("#signin-submit").await;
        self.wait_for(
            "the live indicator",
            "return document.querySelector('#live.on') !== null",
            json!([]),
        )
        .await;
    }

    /// Runs `script` in the page (`arguments[0..]` are `args`); its result.
    pub(crate) async fn eval(&self, script: &str, args: Value) -> Value {
        let answer = self
            .command(
                "POST",
                "/execute/sync",
                json!({ "script": script, "args": args }),
            )
            .await;
        answer["value"].clone()
    }

    /// Waits until `script` returns something truthy; returns it. The
    /// failure shows `what` and the page's text.
    pub(crate) async fn wait_for(&self, what: &str, script: &str, args: Value) -> Value {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let value = self.eval(script, args.clone()).await;
            let truthy = match &value {
                Value::Null => false,
                Value::Bool(b) => *b,
                Value::String(s) => !s.is_empty(),
                Value::Array(a) => !a.is_empty(),
                _ => true,
            };
            if truthy {
                return value;
            }
            if tokio::time::Instant::now() > deadline {
                let text = self.eval("return document.body.innerText", json!([])).await;
                panic!(
                    "the page never showed {what}; it shows:\n{}",
                    text.as_str().unwrap_or("")
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The element `css` finds once the page shows it.
    pub(crate) async fn find(&self, css: &str) -> Element<'_> {
        self.wait_for(
            &format!("`{css}`"),
            "return document.querySelector(arguments[0]) !== null",
            json!([css]),
        )
        .await;
        let answer = self
            .command(
                "POST",
                "/element",
                json!({ "using": "css selector", "value": css }),
            )
            .await;
        Element {
            browser: self,
            id: element_id(&answer["value"]),
        }
    }

    /// The text `css` shows, once it is there.
    pub(crate) async fn text(&self, css: &str) -> String {
        let element = self.find(css).await;
        let answer = self
            .command("GET", &format!("/element/{}/text", element.id), json!({}))
            .await;
        answer["value"].as_str().unwrap_or("").to_owned()
    }

    /// Presses Ctrl and `key` together.
    pub(crate) async fn chord(&self, key: &str) {
        const CONTROL: &str = "\u{E009}";
        let actions = json!({ "actions": [{ "type": "key", "id": "keyboard", "actions": [
            { "type": "keyDown", "value": CONTROL },
            { "type": "keyDown", "value": key },
            { "type": "keyUp", "value": key },
            { "type": "keyUp", "value": CONTROL }
        ]}]});
        self.command("POST", "/actions", actions).await;
    }

    /// A PNG of the window.
    pub(crate) async fn screenshot(&self) -> Vec<u8> {
        use base64::Engine as _;
        let answer = self.command("GET", "/screenshot", json!({})).await;
        base64::engine::general_purpose::STANDARD
            .decode(answer["value"].as_str().unwrap())
            .unwrap()
    }
}

impl Element<'_> {
    pub(crate) async fn type_text(&self, text: &str) {
        self.browser
            .command(
                "POST",
                &format!("/element/{}/value", self.id),
                json!({ "text": text }),
            )
            .await;
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // The driver and the browsers it started: its process group.
        let group = format!("-{}", self.driver.id());
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.driver.wait();
    }
}
