//! The operator's dashboard at `/`: one HTML page, its stylesheet and its
//! scripts (the app, and the widgets' page), written by hand and compiled
//! into the binary, so `tok serve` is the whole product with no web server
//! or build step beside it.
//!
//! The page signs in with an API key kept in the browser's session storage
//! and uses the REST API like any other client (`X-Tok-Tenant` when the
//! admin picks a tenant); it follows `GET /api/stream` to update what it
//! shows as runs move. Nothing here reads the database.

use axum::http::header;
use axum::response::IntoResponse;

use crate::routes::{Public, Routes};

const INDEX: &str = include_str!("index.html");
const STYLE: &str = include_str!("app.css");
const SCRIPT: &str = include_str!("app.js");
const WIDGETS_SCRIPT: &str = include_str!("widgets.js");

pub(crate) fn router() -> Routes {
    Routes::new()
        .get("/", Public, index)
        .get("/dashboard/app.css", Public, style)
        .get("/dashboard/app.js", Public, script)
        .get("/dashboard/widgets.js", Public, widgets_script)
}

/// The page may run only its own script and talk only to this server.
const POLICY: &str = "default-src 'self'; img-src 'self' data:; style-src 'self'; \
     script-src 'self'; connect-src 'self'; frame-ancestors 'none'";

async fn index() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CONTENT_SECURITY_POLICY, POLICY),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        INDEX,
    )
}

async fn style() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        STYLE,
    )
}

async fn script() -> impl IntoResponse {
    javascript(SCRIPT)
}

async fn widgets_script() -> impl IntoResponse {
    javascript(WIDGETS_SCRIPT)
}

fn javascript(text: &'static str) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        text,
    )
}
