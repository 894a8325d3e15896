// tok's dashboard: a small single-page app over tok's REST API and its
// live stream. Plain DOM, no framework; every page is a function that
// renders into #view and may react to stream events.
"use strict";

const session = {
  key: sessionStorage.getItem("tok.key"),
  tenant: sessionStorage.getItem("tok.tenant"),
  kind: null,
  name: null,
};

// ---------- small helpers ----------

const $ = (sel, root = document) => root.querySelector(sel);

/** Builds an element: h("td.error-cell", {title: x}, "text", child…). */
function h(tag, attrs, ...children) {
  const [name, ...classes] = tag.split(".");
  const el = document.createElement(name);
  if (classes.length) el.className = classes.join(" ");
  if (attrs) {
    for (const [k, v] of Object.entries(attrs)) {
      if (v === null || v === undefined || v === false) continue;
      if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else if (k === "dataset") Object.assign(el.dataset, v);
      else if (k === "value") el.value = v;
      else el.setAttribute(k, v === true ? "" : v);
    }
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/** Replaces `el`'s children with those given, leaving out null and false. */
function fill(el, ...children) {
  el.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined && c !== false));
  return el;
}

function toDate(v) {
  if (v === null || v === undefined || v === "") return null;
  const d = typeof v === "number" ? new Date(v) : new Date(v);
  return isNaN(d) ? null : d;
}

function ago(v) {
  const d = toDate(v);
  if (!d) return "—";
  const s = Math.round((Date.now() - d.getTime()) / 1000);
  if (s < 5) return "just now";
  if (s < 60) return `${s}s ago`;
  if (s < 3600) return `${Math.floor(s / 60)}m ago`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ago`;
  return d.toLocaleDateString();
}

function when(v) {
  const d = toDate(v);
  return h("span", { title: d ? d.toISOString() : "" }, ago(v));
}

// A run's progress: "3 of 5" where its tree fixes the total, else the
// steps done ("7").
function progressText(progress) {
  if (!progress) return "";
  return progress.total == null ? `${progress.done}` : `${progress.done} of ${progress.total}`;
}

function duration(from, to) {
  const a = toDate(from);
  const b = toDate(to);
  if (!a || !b) return "—";
  const ms = b - a;
  if (ms < 1000) return `${ms} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(1)} s`;
  return `${Math.floor(ms / 60000)}m ${Math.round((ms % 60000) / 1000)}s`;
}

const pill = (status) => h(`span.pill.${String(status).replace(/[^a-z-]/g, "")}`, null, status);
// Ids begin with their time; their random end tells them apart.
const short = (id) => (id ? `…${String(id).slice(-8)}` : "—");

function flash(message, ok = false) {
  const el = $("#flash");
  el.textContent = message;
  el.className = ok ? "flash ok" : "flash";
  el.hidden = false;
  clearTimeout(flash.timer);
  flash.timer = setTimeout(() => (el.hidden = true), ok ? 2500 : 8000);
}

/** Calls the API as the signed-in key (and the admin's chosen tenant). */
async function api(path, options = {}) {
  const headers = { Authorization: `Bearer ${session.key}` };
  if (session.kind === "admin" && session.tenant) headers["X-Tok-Tenant"] = session.tenant;
  if (options.body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method: options.method || "GET",
    headers,
    body: options.body === undefined ? undefined : JSON.stringify(options.body),
  });
  const text = await response.text();
  let body = null;
  try {
    body = text ? JSON.parse(text) : null;
  } catch {
    body = { error: { message: text } };
  }
  if (!response.ok) {
    const message = body && body.error ? body.error.message : `${response.status}`;
    const error = new Error(message);
    error.status = response.status;
    throw error;
  }
  return body;
}

/** Every item of a listing, page after page (500 a page, the most it takes). */
async function all(path) {
  const items = [];
  let cursor = null;
  do {
    const sep = path.includes("?") ? "&" : "?";
    const page = await api(`${path}${sep}limit=500${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""}`);
    items.push(...page.items);
    cursor = page.next_cursor;
  } while (cursor);
  return items;
}

/** A time to come: "in 5m", with the exact time as its title. */
function until(v) {
  const d = toDate(v);
  if (!d) return h("span.muted", null, "—");
  const s = Math.round((d.getTime() - Date.now()) / 1000);
  const text = s <= 0 ? "due now" : s < 60 ? `in ${s}s` : s < 3600 ? `in ${Math.floor(s / 60)}m`
    : s < 86400 ? `in ${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m` : d.toLocaleString();
  return h("span.next-run", { title: d.toISOString() }, text);
}

// ---------- sign-in ----------

/** Whether the signed-in key may do what needs `scope` (`write` grants `read` and `signal`, `admin` all). */
function allows(scope) {
  const held = session.scopes || [];
  return held.includes("admin") || held.includes(scope) || ((scope === "read" || scope === "signal") && held.includes("write"));
}

/** Acts on a button's second click: the first arms it, saying `armed`
 * ("Click again to delete"); the second runs `act`, whose error (a 409's
 * message: what uses the thing) is flashed, and the button disarmed. */
async function twice(button, armed, act) {
  if (!button.dataset.armed) {
    button.dataset.label = button.textContent;
    button.dataset.armed = "yes";
    button.textContent = armed;
    button.classList.add("danger");
    return;
  }
  try {
    await act();
  } catch (e) {
    delete button.dataset.armed;
    button.textContent = button.dataset.label;
    button.classList.remove("danger");
    flash(e.message);
  }
}

async function signIn(key) {
  session.key = key;
  const me = await api("/api/dashboard/session");
  session.kind = me.kind;
  session.scopes = me.scopes;
  $("#nav-keys").hidden = !allows("admin");
  $("#nav-audit").hidden = !allows("admin");
  sessionStorage.setItem("tok.key", key);
  const pick = $("#tenant-pick");
  if (me.kind === "admin") {
    // A tenant being deleted can no longer be acted for.
    const tenants = (await all("/api/tenants")).filter((t) => t.status !== "deleting");
    fill(pick,
      h("option", { value: "" }, tenants.length ? "Pick a tenant…" : "No tenants yet"),
      ...tenants.map((t) => h("option", { value: t.id }, t.name)),
    );
    if (!tenants.some((t) => t.id === session.tenant)) session.tenant = tenants.length === 1 ? tenants[0].id : null;
    pick.value = session.tenant || "";
    const name = tenants.find((t) => t.id === session.tenant);
    session.name = name ? name.name : null;
    fill($("#who"), h("strong", null, "Platform admin"), session.name ? `acting for ${session.name}` : "no tenant picked");
  } else {
    session.tenant = me.tenant.id;
    session.name = me.tenant.name;
    fill($("#who"), h("strong", null, me.tenant.name || me.tenant.id), "tenant key");
  }
  pick.hidden = me.kind !== "admin";
  $("#tenant-pick-label").hidden = me.kind !== "admin";
  if (session.tenant) sessionStorage.setItem("tok.tenant", session.tenant);
  $("#signin").hidden = true;
  $("#app").hidden = false;
  live.start();
  route();
}

function signOut() {
  sessionStorage.removeItem("tok.key");
  sessionStorage.removeItem("tok.tenant");
  session.key = session.tenant = session.kind = session.name = session.scopes = null;
  live.stop();
  $("#app").hidden = true;
  $("#signin").hidden = false;
  $("#signin-key").value = "";
  $("#signin-key").focus();
}

// ---------- the live stream ----------

/** Follows GET /api/stream with fetch (EventSource cannot send the key). */
const live = {
  controller: null,
  lastId: null,
  /** Why the server ended the stream for good (its `closed` event). */
  closed: null,
  listeners: new Set(),

  start() {
    this.stop();
    this.lastId = null;
    if (!session.tenant) return this.show(false, "pick a tenant");
    this.connect();
  },

  stop() {
    if (this.controller) this.controller.abort();
    this.controller = null;
  },

  show(on, text) {
    const el = $("#live");
    el.classList.toggle("on", on);
    el.textContent = text;
  },

  async connect() {
    const controller = new AbortController();
    this.controller = controller;
    const headers = { Authorization: `Bearer ${session.key}` };
    if (session.kind === "admin") headers["X-Tok-Tenant"] = session.tenant;
    if (this.lastId) headers["Last-Event-ID"] = this.lastId;
    try {
      const response = await fetch("/api/stream", { headers, signal: controller.signal });
      if (!response.ok) throw new Error(`stream answered ${response.status}`);
      this.show(true, "live");
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          this.parse(buffer.slice(0, end));
          buffer = buffer.slice(end + 2);
        }
      }
    } catch (e) {
      if (controller.signal.aborted) return;
    }
    if (this.controller !== controller) return;
    if (this.closed) {
      // The key was revoked or expired: the server ended the stream for
      // good, and every other request with the key is refused too.
      const reason = this.closed;
      this.closed = null;
      signOut();
      const error = $("#signin-error");
      error.textContent = reason;
      error.hidden = false;
      return;
    }
    this.show(false, "reconnecting…");
    setTimeout(() => this.controller === controller && this.connect(), 1500);
  },

  parse(block) {
    let type = "message";
    let data = "";
    let id = null;
    for (const line of block.split("\n")) {
      if (line.startsWith(":")) continue;
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
      if (field === "event") type = value;
      else if (field === "data") data += (data ? "\n" : "") + value;
      else if (field === "id") id = value;
    }
    if (!data) return;
    if (id) this.lastId = id;
    let payload = {};
    try {
      payload = JSON.parse(data);
    } catch {
      return;
    }
    if (type === "closed") this.closed = payload.message || "The stream was closed: sign in again.";
    for (const listener of this.listeners) listener(type, payload);
  },
};

/** Calls `fn` at most once per `ms`, after the last call. */
function debounce(fn, ms) {
  let timer = null;
  return (...args) => {
    clearTimeout(timer);
    timer = setTimeout(() => fn(...args), ms);
  };
}

// ---------- routing ----------

const pages = {};
let leaving = null;

function route() {
  if (!session.key) return;
  if (leaving) leaving();
  leaving = null;
  live.listeners.clear();
  const parts = (location.hash.replace(/^#\/?/, "") || "runs").split("/");
  const [page, id] = parts;
  for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", a.dataset.page === page);
  const view = $("#view");
  fill(view);
  $("#flash").hidden = true;
  // The audit log is the one page the platform admin sees across tenants.
  if (!session.tenant && !(page === "audit" && session.kind === "admin")) {
    $("#title").textContent = "Pick a tenant";
    view.append(h("div.card.empty", null, "The admin key acts for one tenant at a time: pick one in the sidebar."));
    return;
  }
  const render = pages[page] || pages.runs;
  render(view, id).catch((e) => flash(e.message));
}

/** Registers a stream listener for the page now shown. */
const onLive = (fn) => live.listeners.add(fn);

// ---------- Runs ----------

const STATUSES = ["queued", "running", "waiting", "paused", "compensating", "completed", "failed", "cancelled", "refused", "skipped", "expired"];
const TRIGGERS = ["webhook", "event", "poll", "schedule", "manual"];
let automationNames = new Map();

async function loadAutomations() {
  const list = await all("/api/automations");
  automationNames = new Map(list.map((a) => [a.id, a.name]));
  return list;
}

const runFilters = { status: "", automation: "", trigger: "" };

async function runList(view) {
  $("#title").textContent = "Runs";
  const automations = await loadAutomations();
  const select = (name, values, labels) =>
    h("div.field", null, h("label", { for: `filter-${name}` }, name[0].toUpperCase() + name.slice(1)),
      h("select", { id: `filter-${name}`, onchange: (e) => { runFilters[name] = e.target.value; load(); } },
        h("option", { value: "" }, "All"),
        values.map((v, i) => h("option", { value: v }, labels ? labels[i] : v))));
  const toolbar = h("div.toolbar", null,
    select("status", STATUSES),
    select("automation", automations.map((a) => a.id), automations.map((a) => a.name)),
    select("trigger", TRIGGERS));
  for (const [name, value] of Object.entries(runFilters)) $(`#filter-${name}`, toolbar).value = value;
  const bulk = h("div.bulk", { id: "bulk" });
  if (allows("write")) toolbar.append(bulk);
  const table = h("div.card.table-card");
  view.append(toolbar, table);
  // Rows by run id: an update redraws a row's cells in the same row, so
  // the list does not jump and a click in progress is not lost.
  const rows = new Map();
  let cursor = null;

  function row(run) {
    let tr = rows.get(run.id);
    if (!tr) {
      tr = h("tr.link", { dataset: { run: run.id }, onclick: () => (location.hash = `#/runs/${run.id}`) });
      if (rows.size) tr.classList.add("fresh");
      rows.set(run.id, tr);
    }
    tr.dataset.status = run.status;
    fill(tr,
      h("td", null, pill(run.status)),
      h("td", null, automationNames.get(run.automation_id) || run.automation_id, h("span.muted", null, ` v${run.version}`)),
      h("td", null, run.trigger_type),
      h("td", null, when(run.started_at || run.created_at)),
      h("td", null, duration(run.started_at, run.finished_at)),
      h("td.progress", null, progressText(run.progress)),
      h("td.mono", null, short(run.id)),
      h("td.error-cell", { title: run.error || "" }, run.error || ""));
    return tr;
  }

  async function load(more = false) {
    const query = new URLSearchParams({ limit: "50" });
    for (const [k, v] of Object.entries(runFilters)) if (v) query.set(k, v);
    if (more && cursor) query.set("cursor", cursor);
    const page = await api(`/api/dashboard/runs?${query}`);
    cursor = page.next_cursor;
    const drawn = page.items.map(row);
    // The first draw marks nothing as new.
    if (!more && !$("tbody", table)) for (const tr of drawn) tr.classList.remove("fresh");
    let body = $("tbody", table);
    if (!body) {
      body = h("tbody");
      fill(table, h("table", { id: "runs" },
        h("thead", null, h("tr", null, ["Status", "Automation", "Trigger", "Started", "Took", "Steps", "Run", "Error"].map((c) => h("th", null, c)))),
        body));
    }
    if (more) body.append(...drawn);
    else fill(body, drawn);
    for (const extra of table.querySelectorAll(".empty, .more")) extra.remove();
    if (!body.children.length) table.append(h("div.empty", null, "No runs yet. Send a webhook to one of your automations and it shows up here at once."));
    if (cursor) table.append(h("div.more", null, h("button.button.small", { onclick: () => load(true) }, "Load more")));
  }

  // Every run the filters take, not only the page shown: a dry run
  // counts them and arms the button; its second click makes the operation.
  function bulkBar() {
    const action = runFilters.status === "failed" ? "retry"
      : ["queued", "running", "waiting", "paused"].includes(runFilters.status) ? "cancel" : null;
    if (!action) {
      fill(bulk, h("span.muted", null, "Filter by status failed (to retry) or unfinished (to cancel) to act on every matching run."));
      return;
    }
    const filter = Object.fromEntries(Object.entries(runFilters).filter(([, v]) => v));
    const version = h("select", { id: "bulk-version", title: "The version a retried run goes on with" },
      h("option", { value: "original" }, "on their version"),
      h("option", { value: "current" }, "on the current version"));
    const label = action === "retry" ? "Retry all matching" : "Cancel all matching";
    const button = h("button.button.small", { id: "bulk-act", type: "button" }, label);
    button.onclick = async () => {
      const body = { filter, action };
      if (action === "retry") body.version = version.value;
      try {
        if (!button.dataset.armed) {
          const dry = await api("/api/runs/bulk", { method: "POST", body: { ...body, dry_run: true } });
          if (!dry.count) return flash("No run matches.");
          button.dataset.armed = String(dry.count);
          button.textContent = `${action === "retry" ? "Retry" : "Cancel"} ${dry.count} runs: click again`;
          button.classList.add("danger");
          return;
        }
        const made = await api("/api/runs/bulk", { method: "POST", body });
        flash(`${action === "retry" ? "Retrying" : "Cancelling"} ${made.total} runs`, true);
        location.hash = `#/operations/${made.operation_id}`;
      } catch (e) {
        delete button.dataset.armed;
        button.textContent = label;
        button.classList.remove("danger");
        flash(e.message);
      }
    };
    fill(bulk, action === "retry" ? version : null, button);
  }

  bulkBar();
  for (const sel of toolbar.querySelectorAll("select[id^=filter-]")) sel.addEventListener("change", bulkBar);
  await load();
  const refresh = debounce(() => load().catch(() => {}), 250);
  onLive((type) => {
    if (type === "run.updated" || type === "reload") refresh();
  });
}

// ---------- Operations ----------

// Bulk retries and cancels: how far each is, and the runs it could not
// act on. The page polls while an operation runs.
pages.operations = async (view, id) => {
  $("#title").textContent = "Operations";
  const table = h("div.card.table-card");
  const detail = h("div", { id: "operation-detail" });
  view.append(h("div.stack", null, detail, table));
  let timer = null;
  leaving = () => clearTimeout(timer);

  const progress = (op) => `${op.done + op.failed} of ${op.total}`;
  function row(op) {
    return h("tr.link", { dataset: { operation: op.id, status: op.status }, onclick: () => (location.hash = `#/operations/${op.id}`) },
      h("td", null, pill(op.status)),
      h("td", null, op.action, op.action === "retry" ? h("span.muted", null, ` (${op.version} version)`) : null),
      h("td.progress", null, progress(op)),
      h("td", null, String(op.failed)),
      h("td", null, when(op.created_at)),
      h("td.mono", null, short(op.id)));
  }

  async function load() {
    const page = await api("/api/operations?limit=50");
    let running = page.items.some((op) => op.status === "running");
    fill(table, page.items.length
      ? h("table", { id: "operations" },
        h("thead", null, h("tr", null, ["Status", "Action", "Progress", "Failed", "Made", "Operation"].map((c) => h("th", null, c)))),
        h("tbody", null, page.items.map(row)))
      : h("div.empty", null, "No operations yet. Filter the runs page by status to retry or cancel every matching run at once."));
    if (id) {
      const op = await api(`/api/operations/${encodeURIComponent(id)}`);
      running ||= op.status === "running";
      const stop = h("button.button.small", { id: "operation-cancel", type: "button" }, "Stop");
      stop.onclick = () => api(`/api/operations/${op.id}/cancel`, { method: "POST", body: {} }).then(load).catch((e) => flash(e.message));
      fill(detail, h("div.card", { dataset: { operation: op.id, status: op.status } },
        h("h2", null, `${op.action === "retry" ? "Retry" : "Cancel"} of ${op.total} runs `, pill(op.status)),
        h("p", null, h("span.progress", null, progress(op)), ` done: ${op.done} acted on, ${op.failed} could not be.`),
        op.failures.length
          ? h("table", { id: "operation-failures" }, h("tbody", null, op.failures.map((f) =>
            h("tr", null, h("td.mono", null, h("a", { href: `#/runs/${f.run_id}` }, short(f.run_id))), h("td", null, f.reason)))))
          : null,
        op.status === "running" && allows("write") ? stop : null));
    }
    if (running) timer = setTimeout(() => load().catch((e) => flash(e.message)), 1000);
  }

  await load();
};

// ---------- Run detail ----------

function controlsFor(status) {
  return {
    retry: status === "failed",
    // A compensating run undoes its steps; a cancel does not interrupt that.
    cancel: !["compensating", "completed", "failed", "cancelled", "refused", "skipped", "expired"].includes(status),
    pause: ["queued", "running", "waiting"].includes(status),
    resume: status === "paused",
  };
}

/** The automation's tree with the steps this run took marked. */
function tree(steps, taken, prefix = "") {
  return h("ul.tree", null, (steps || []).map((step, i) => {
    const path = prefix ? `${prefix}.${i}` : String(i);
    const record = taken.get(path);
    const status = record ? record.status : null;
    const node = h(`span.node.${record ? "taken" : "not-taken"}`, { dataset: { path } },
      h(`span.dot.${status || "none"}`), h("span", null, step.id || path), h("span.type", null, step.type));
    const branches = [];
    for (const key of ["then", "else", "steps", "do", "compensate"]) {
      if (Array.isArray(step[key])) {
        branches.push(h("div.branch", null, key), tree(step[key], taken, `${path}.${key}`));
      }
    }
    if (Array.isArray(step.branches)) {
      step.branches.forEach((b, j) => branches.push(h("div.branch", null, `branch ${j}`), tree(b.steps || b, taken, `${path}.branches.${j}`)));
    }
    return h("li", null, node, branches);
  }));
}

// What holds a run (`blocked_by`), as the operator reads it.
const HELD = {
  approval: "a decision on its approval",
  signal: "a signal",
  condition: "its ticket's condition",
  runs: "the runs it started",
  breaker: "its connection's open circuit breaker",
  connection_concurrency: "its connection's limit of calls in flight",
  connection_rate: "its connection's rate limit",
  timer: "a timer",
  queue_key: "another run of its ticket",
  tenant_concurrency: "the tenant's limit of steps in flight",
};
function heldBy(b) {
  const d = b.detail || {};
  const what = {
    approval: () => h("a", { href: "#/approvals" }, "open approvals"),
    signal: () => d.subject
      ? [h("code", null, d.key), " about ", h("a", { href: `#/tickets/${d.subject}` }, d.subject)]
      : h("code", null, d.key),
    runs: () => d.runId ? h("a", { href: `#/runs/${d.runId}` }, d.runId) : null,
    condition: () => d.ticketId ? h("a", { href: `#/tickets/${d.ticketId}` }, d.ticketId) : null,
    queue_key: () => d.runId ? ["ahead: ", h("a", { href: `#/runs/${d.runId}` }, d.runId)] : null,
    tenant_concurrency: () => `${d.running} of ${d.limit} steps in flight`,
    timer: () => d.path ? `at step ${d.path}` : null,
  }[b.kind];
  const detail = what ? what() : d.reason || null;
  return h("div", { dataset: { kind: b.kind } },
    h("div", null, HELD[b.kind] || b.kind, b.until ? [" until ", when(b.until)] : ""),
    detail ? h("div.muted", null, detail) : null);
}

async function runDetail(view, id) {
  $("#title").textContent = "Run";
  const head = h("div.card");
  const side = h("div.stack");
  const main = h("div.stack");
  view.append(h("div.stack", null, head, h("div.grid-side", null, main, side)));
  let definition = null;

  async function load() {
    const run = await api(`/api/runs/${encodeURIComponent(id)}`);
    if (!automationNames.size) await loadAutomations();
    if (!definition) {
      definition = await api(`/api/automations/${encodeURIComponent(run.automation_id)}/versions/${run.version}`)
        .then((v) => v.definition)
        .catch(() => null);
    }
    const name = automationNames.get(run.automation_id) || run.automation_id;
    $("#title").textContent = name;
    const can = controlsFor(run.status);
    // A key without `write` sees the run, not the controls it cannot use.
    const button = (action, label, cls = "") => allows("write")
      ? h(`button.button${cls}`, { id: `run-${action}`, disabled: !can[action], onclick: () => control(action) }, label)
      : null;
    fill(head,
      h("div.run-head", null, h("span", { id: "run-status" }, pill(run.status)),
        h("span.mono.muted", null, run.id),
        h("div.actions", null, button("retry", "Retry", ".primary"), button("pause", "Pause"), button("resume", "Resume"), button("cancel", "Cancel", ".danger"))),
      h("dl.kv", null,
        h("dt", null, "Automation"), h("dd", null, h("a", { href: `#/automations/${run.automation_id}` }, name), ` version ${run.version}`),
        h("dt", null, "Trigger"), h("dd", null, run.trigger_type),
        h("dt", null, "Started"), h("dd", null, when(run.started_at || run.created_at)),
        h("dt", null, "Took"), h("dd", null, duration(run.started_at, run.finished_at)),
        h("dt", null, "Steps"), h("dd", { id: "run-progress" }, progressText(run.progress)),
        run.subject_ticket_id ? [h("dt", null, "Ticket"), h("dd", null, h("a", { href: `#/tickets/${run.subject_ticket_id}` }, run.subject_ticket_id))] : null),
      run.error ? h("div.run-error", { id: "run-error" }, run.error) : null);

    const taken = new Map();
    for (const step of run.steps) taken.set(step.path, step);
    fill(side,
      h("div.card", null, h("h2", null, "Path taken"), definition ? tree(definition.steps, taken) : h("p.muted", null, "The definition of this version is not available.")),
      run.blocked_by ? h("div.card", { id: "run-held" }, h("h2", null, "Held by"), heldBy(run.blocked_by)) : null,
      run.waits && run.waits.length ? h("div.card", null, h("h2", null, "Waiting for"),
        run.waits.map((w) => h("div", null, h("code", null, w.key),
          w.subject ? [" about ", h("a", { href: `#/tickets/${w.subject}` }, w.subject)] : "",
          " at ", w.path, w.due_at ? [" until ", when(w.due_at)] : ""))) : null,
      h("div.card", null, h("details", null, h("summary", null, "Context"), h("pre", null, JSON.stringify(run.context, null, 2)))));

    fill(main, h("div.card", { id: "steps" }, h("h2", null, `Steps (${run.steps.length})`),
      run.steps.length ? run.steps.map((s) => h("div.attempt", { dataset: { path: s.path, status: s.status } },
        h("div.attempt-head", null, h(`span.dot.${s.status}`), h("span.step-id", null, s.step_id), h("span.muted", null, s.type),
          pill(s.status), h("span.muted", null, `attempt ${s.attempt}`), h("span.muted", null, `path ${s.path}`),
          h("span.muted", null, duration(s.started_at, s.finished_at))),
        s.log && s.log.length ? h("div.log", null, s.log.map((line) => h("div.log-line", null, line))) : null,
        s.error ? h("div.step-error", null, s.error) : null,
        s.output || s.input ? h("details", null, h("summary", null, "Input and output"),
          h("pre", null, JSON.stringify({ input: s.input, output: s.output }, null, 2))) : null))
        : h("p.muted", null, "No step has run yet.")));
  }

  async function control(action) {
    try {
      await api(`/api/runs/${encodeURIComponent(id)}/${action}`, { method: "POST" });
      flash(`Run ${action === "retry" ? "retried" : action + "d"}.`, true);
      await load();
    } catch (e) {
      flash(e.message);
    }
  }

  await load();
  const refresh = debounce(() => load().catch(() => {}), 200);
  onLive((type, data) => {
    if (type === "reload" || data.run_id === id) refresh();
  });
}

pages.runs = (view, id) => (id ? runDetail(view, id) : runList(view));

// ---------- Automations ----------

pages.automations = async (view, id) => {
  if (id) return pages.automation_detail(view, id);
  $("#title").textContent = "Automations";
  const [list, sources] = await Promise.all([loadAutomations(), all("/api/sources")]);
  const bySource = new Map(sources.map((s) => [s.id, s]));
  if (!list.length) {
    view.append(h("div.card.empty", null, "No automations yet: POST one to /api/automations."));
    return;
  }
  view.append(h("div.card.table-card", null, h("table", { id: "automations" },
    h("thead", null, h("tr", null, ["Name", "Status", "Trigger", "Next run", "Version", "Updated"].map((c) => h("th", null, c)))),
    h("tbody", null, list.map((a) => {
      const trigger = a.definition.trigger || {};
      const source = trigger.source && bySource.get(trigger.source);
      return h("tr.link", { onclick: () => (location.hash = `#/automations/${a.id}`) },
        h("td", null, h("strong", null, a.name)),
        h("td", null, pill(a.status)),
        h("td", null, trigger.kind, source ? h("span.muted", null, ` · ${source.name}`) : trigger.event ? h("span.muted", null, ` · ${trigger.event}`) : ""),
        h("td.next-run-cell", null, a.next_run_at ? until(a.next_run_at) : h("span.muted", null, "—")),
        h("td", null, `v${a.version}`),
        h("td", null, when(a.updated_at || a.created_at)));
    })))));
};

/** How an automation's `flow` shapes its starts, in a line; "" without one. */
function flowText(flow) {
  if (!flow) return "";
  const per = (c) => (c.key ? ` per ${c.key}` : "");
  const parts = [];
  if (flow.debounce) parts.push(`debounced${per(flow.debounce)}: one run ${flow.debounce.period} after the last event${flow.debounce.maxWait ? `, at most ${flow.debounce.maxWait} after the first` : ""}`);
  if (flow.throttle) parts.push(`throttled${per(flow.throttle)}: at most ${flow.throttle.limit} starts per ${flow.throttle.period}${flow.throttle.burst ? `, ${flow.throttle.burst} at once` : ""}`);
  if (flow.batch) parts.push(`batched${per(flow.batch)}: up to ${flow.batch.maxSize} events per run, or what came in ${flow.batch.timeout}`);
  if (flow.singleton) parts.push(`one run at a time${per(flow.singleton)}; a later event ${flow.singleton.mode === "cancel" ? "cancels the running one" : "is skipped"}`);
  if (flow.priority !== undefined) parts.push(`priority ${flow.priority}`);
  if (flow.startTimeout) parts.push(`expires if not started within ${flow.startTimeout}`);
  return parts.join(" · ");
}

function triggerText(trigger) {
  switch (trigger.kind) {
    case "webhook": return "a webhook from its source";
    case "event": return `the event ${trigger.event}`;
    case "poll": return `a poll every ${trigger.intervalSec || 60} s`;
    case "schedule": return `the schedule ${trigger.cron}${trigger.timezone ? ` (${trigger.timezone})` : ""}`;
    default: return trigger.kind;
  }
}

pages.automation_detail = async (view, id) => {
  const a = await api(`/api/automations/${encodeURIComponent(id)}`);
  $("#title").textContent = a.name;
  const trigger = a.definition.trigger || {};
  const info = h("div.card.stack");
  const versionBox = h("div.card");
  view.append(h("div.grid-side", null, h("div.stack", null, info, versionBox), h("div.stack", { id: "webhook-box" })));

  const setStatus = async (action) => {
    try {
      await api(`/api/automations/${encodeURIComponent(id)}/${action}`, { method: "POST" });
      flash(`Automation ${action}d.`, true);
      route();
    } catch (e) {
      flash(e.message);
    }
  };
  // The first click asks, the second deletes (archives: its runs stay).
  const remove = (button) => twice(button, "Click again to delete", async () => {
    await api(`/api/automations/${encodeURIComponent(id)}`, { method: "DELETE" });
    flash(`Automation “${a.name}” deleted; its runs are kept.`, true);
    location.hash = "#/automations";
  });
  const live = a.status !== "archived";
  info.append(
    h("div.attempt-head", null, pill(a.status), h("span.mono.muted", null, a.id),
      h("div.actions", null,
        allows("write") && live ? [
          h("button.button", { id: "automation-pause", disabled: a.status !== "active", onclick: () => setStatus("pause") }, "Pause"),
          h("button.button", { id: "automation-resume", disabled: a.status !== "paused", onclick: () => setStatus("resume") }, "Resume"),
          h("button.button", { id: "automation-delete", type: "button", onclick: (e) => remove(e.currentTarget) }, "Delete")] : null,
        h("a.button", { href: `#/runs`, onclick: () => { runFilters.automation = a.id; } }, "Its runs"))),
    h("dl.kv", null,
      h("dt", null, "Runs on"), h("dd", null, triggerText(trigger)),
      flowText(a.definition.flow) ? [h("dt", null, "Starts"), h("dd", { id: "flow-control" }, flowText(a.definition.flow))] : null,
      a.next_run_at ? [h("dt", null, "Next run"), h("dd", { id: "next-run" }, until(a.next_run_at), h("span.muted", null, ` · ${toDate(a.next_run_at).toLocaleString()}`))] : null,
      h("dt", null, "Version"), h("dd", null, `v${a.version}`, h("span.muted", null, ` · hash ${String(a.hash || "").slice(0, 12)}`)),
      h("dt", null, "Updated"), h("dd", null, when(a.updated_at || a.created_at))));

  const versions = h("select", { id: "version-pick" });
  for (let v = a.version; v >= 1; v--) versions.append(h("option", { value: v }, `v${v}${v === a.version ? " (current)" : ""}`));
  const shown = h("pre");
  const showVersion = async () => {
    const v = await api(`/api/automations/${encodeURIComponent(id)}/versions/${versions.value}`);
    shown.textContent = JSON.stringify(v.definition, null, 2);
  };
  versions.addEventListener("change", () => showVersion().catch((e) => flash(e.message)));
  versionBox.append(h("div.toolbar", null, h("h2", null, "Versions"), versions), h("details", { open: true }, h("summary", null, "Definition"), shown));
  await showVersion();

  const box = $("#webhook-box", view);
  if (trigger.kind === "webhook" && trigger.source) {
    const source = await api(`/api/sources/${encodeURIComponent(trigger.source)}`);
    const input = h("input", { id: "webhook-url", readonly: true, value: source.url });
    const copy = h("button.button.primary", { id: "copy-url", onclick: () => copyText(source.url, copy) }, "Copy");
    const help = h("pre", { id: "webhook-help" }, "loading…");
    // A new URL; the one before keeps working for the overlap chosen.
    const overlap = h("select", { id: "rotate-overlap" },
      h("option", { value: "" }, "old URL stops now"),
      h("option", { value: "1h" }, "old URL works 1 hour more"),
      h("option", { value: "24h" }, "old URL works 24 hours more"));
    const rotate = async () => {
      try {
        const body = overlap.value ? { overlap: overlap.value } : {};
        const rotated = await api(`/api/sources/${encodeURIComponent(source.id)}/rotate`, { method: "POST", body });
        input.value = rotated.url;
        source.url = rotated.url;
        flash(rotated.previous_token_expires_at
          ? `New URL made; the old one works until ${toDate(rotated.previous_token_expires_at).toLocaleString()}.`
          : "New URL made; the old one no longer works.", true);
      } catch (e) {
        flash(e.message);
      }
    };
    const tryBox = tryBodyBox(source);
    box.append(h("div.card.stack", null, h("h2", null, `Webhook · ${source.name}`),
      h("div.url-row", null, input, copy),
      allows("write") ? h("div.url-row", null, overlap, h("button.button", { id: "rotate-url", type: "button", onclick: rotate }, "Rotate URL")) : null,
      source.verify ? h("p.note", { id: "webhook-sender" }, `Signed by ${source.verify.preset}: a webhook without its signature is refused.`) : null,
      h("p.note", null, "Send a POST with a JSON body to this URL. A GET on it answers this help:"),
      help),
      tryBox.card);
    fetch(source.url.replace(/^https?:\/\/[^/]+/, ""))
      .then((r) => r.json())
      .then((j) => {
        help.textContent = JSON.stringify(j, null, 2);
        tryBox.example(j.example);
      })
      .catch(() => (help.textContent = "the help could not be loaded"));
  } else {
    box.append(h("div.card", null, h("h2", null, "Trigger"), h("pre", null, JSON.stringify(trigger, null, 2))));
  }
};

/**
 * "Try a body": sends the body typed to the source's webhook as a dry run
 * (`?dry_run=true`) with the signed-in key, so a signed source's signature
 * is not asked for, and shows which automations would start and why.
 * Nothing is stored.
 */
function tryBodyBox(source) {
  const path = `${source.url.replace(/^https?:\/\/[^/]+/, "")}?dry_run=true`;
  const body = h("textarea", { id: "try-body", rows: 7, spellcheck: "false" });
  const result = h("div.stack", { id: "try-result" });
  const send = async () => {
    const headers = { Authorization: `Bearer ${session.key}`, "Content-Type": "application/json" };
    if (session.kind === "admin" && session.tenant) headers["X-Tok-Tenant"] = session.tenant;
    fill(result, h("p.muted", null, "checking…"));
    try {
      const response = await fetch(path, { method: "POST", headers, body: body.value });
      const answer = await response.json().catch(() => ({ error: { message: `answered ${response.status}` } }));
      fill(result, response.ok ? dryRunView(answer) : h("p.error-text", { id: "try-error" }, `${response.status}: ${answer.error ? answer.error.message : ""}`));
    } catch (e) {
      fill(result, h("p.error-text", { id: "try-error" }, e.message));
    }
  };
  const card = h("div.card.stack", { id: "try-box" }, h("h2", null, "Try a body"),
    h("p.note", null, "Checked like a real webhook and answered with what would start; nothing is stored and nothing starts."),
    body,
    h("div.actions", null, h("button.button.primary", { id: "try-send", type: "button", onclick: send }, "Try it")),
    result);
  return { card, example: (example) => { if (!body.value && example) body.value = JSON.stringify(example, null, 2); } };
}

/** A dry run's answer: each automation, whether it would start, and why. */
function dryRunView(answer) {
  if (answer.answer) return h("p", { id: "try-summary" }, `Answered ${JSON.stringify(answer.answer)}; ${answer.note || "nothing starts"}.`);
  const n = answer.would_start;
  return [
    h("p", { id: "try-summary" }, `${n} automation${n === 1 ? "" : "s"} would start.`,
      answer.signature && !answer.signature.checked && answer.signature.preset ? h("span.muted", null, ` The ${answer.signature.preset} signature was not checked.`) : null),
    h("ul.try-automations", null, answer.automations.map((a) =>
      h("li", { dataset: { automation: a.id, wouldStart: String(a.would_start) } },
        h("strong", null, a.name), " ", pill(a.would_start ? "starts" : "skipped"), h("span.muted", null, ` ${a.why}`),
        a.filter ? h("pre", null, a.filter.lines.join("\n")) : null,
        a.flow ? h("p.note", null, a.flow) : null))),
    h("details", null, h("summary", null, "Params"), h("pre", null, JSON.stringify(answer.params, null, 2))),
  ];
}

/** Copies `text` to the clipboard; the fallback works where the async API is not allowed. */
async function copyText(text, button) {
  let copied = false;
  try {
    await navigator.clipboard.writeText(text);
    copied = true;
  } catch {
    const area = h("textarea", { readonly: true }, text);
    document.body.append(area);
    area.select();
    copied = document.execCommand("copy");
    area.remove();
  }
  const label = button.textContent;
  button.textContent = copied ? "Copied" : "Copy failed";
  setTimeout(() => (button.textContent = label), 1500);
}

// ---------- Tickets ----------

pages.tickets = async (view, id) => {
  if (id) return pages.ticket_detail(view, id);
  $("#title").textContent = "Tickets";
  const state = { closed: "false" };
  const toolbar = h("div.toolbar", null, h("div.field", null, h("label", { for: "ticket-closed" }, "Show"),
    h("select", { id: "ticket-closed", onchange: (e) => { state.closed = e.target.value; load(); } },
      h("option", { value: "false" }, "Open"), h("option", { value: "true" }, "Closed"), h("option", { value: "" }, "All"))));
  const queues = h("div.columns");
  const table = h("div.card.table-card");
  view.append(toolbar, h("h3", null, "Queues by group and assignee"), queues, h("h3", null, "Tickets"), table);

  async function load() {
    const query = new URLSearchParams({ limit: "200" });
    if (state.closed) query.set("closed", state.closed);
    const [tickets, groups] = await Promise.all([api(`/api/tickets?${query}`).then((t) => t.items), all("/api/groups")]);
    const count = new Map();
    for (const t of tickets) if (t.assignee) count.set(t.assignee.id, (count.get(t.assignee.id) || 0) + 1);
    const unassigned = tickets.filter((t) => !t.assignee).length;
    const write = allows("write");
    fill(queues, ...groups.map((g) => h("div.card", { dataset: { group: g.id } },
      h("div.group-head", null, h("h2", null, g.name),
        write ? h("button.button.small", { type: "button", dataset: { deleteGroup: g.id }, title: "Delete the group and its members",
          onclick: (e) => removeGroup(g, e.currentTarget) }, "Delete") : null),
      g.members.map((m) => {
        const n = count.get(m.id) || 0;
        const bar = h("span");
        bar.style.width = `${Math.min(100, (n / Math.max(1, m.capacity)) * 100)}%`;
        return h("div.queue-person", { dataset: { member: m.id } }, h("div", null, m.name, h("div.bar", null, bar)),
          h("span.muted", null, `${n} / ${m.capacity}`,
            write ? h("button.button.small", { type: "button", dataset: { removeMember: m.id }, title: `Remove ${m.name} from ${g.name}`,
              onclick: (e) => removeMember(g, m, e.currentTarget) }, "Remove") : null));
      }))),
      h("div.card", null, h("h2", null, "Unassigned"), h("div.tile", null, h("div.value", null, unassigned))));
    fill(table, tickets.length ? h("table", { id: "tickets" },
      h("thead", null, h("tr", null, ["Ticket", "Title", "Type", "Status", "Tags", "Assignee", "Updated"].map((c) => h("th", null, c)))),
      h("tbody", null, tickets.map((t) => h("tr.link", { onclick: () => (location.hash = `#/tickets/${t.id}`) },
        h("td.mono", null, t.external_id),
        h("td", null, t.title || ""),
        h("td", null, t.type || "—"),
        h("td", null, t.status || "—", t.closed ? h("span.muted", null, " · closed") : ""),
        h("td", null, (t.tags || []).map((tag) => h("span.tag", null, tag))),
        h("td", null, t.assignee ? t.assignee.name : h("span.muted", null, "unassigned")),
        h("td", null, when(t.updated_at))))))
      : h("div.empty", null, "No tickets here."));
  }

  // The first click asks, the second deletes; a refusal (an automation
  // names the group, its members hold open tickets) says why.
  const removeGroup = (g, button) => twice(button, "Click again to delete", async () => {
    await api(`/api/groups/${encodeURIComponent(g.id)}`, { method: "DELETE" });
    flash(`Group “${g.name}” deleted.`, true);
    await load();
  });
  const removeMember = (g, m, button) => twice(button, "Click again to remove", async () => {
    await api(`/api/groups/${encodeURIComponent(g.id)}/members/${encodeURIComponent(m.id)}`, { method: "DELETE" });
    flash(`${m.name} removed from “${g.name}”.`, true);
    await load();
  });

  await load();
  const refresh = debounce(() => load().catch(() => {}), 300);
  onLive((type) => (type === "ticket.updated" || type === "reload") && refresh());
};

pages.ticket_detail = async (view, id) => {
  async function load() {
    const t = await api(`/api/tickets/${encodeURIComponent(id)}`);
    $("#title").textContent = `Ticket ${t.external_id}`;
    fill(view, h("div.grid-side", null,
      h("div.card", { id: "ticket-trace" }, h("h2", null, "Trace"),
        t.trace.length ? h("table", null, h("tbody", null, t.trace.map((line) => h("tr", null,
          h("td", null, when(line.at)),
          h("td", null, h("span.tag", null, line.kind)),
          h("td", null, line.message),
          h("td", null, line.run_id ? h("a", { href: `#/runs/${line.run_id}` }, short(line.run_id)) : ""))))) : h("p.muted", null, "Nothing yet.")),
      h("div.card", null, h("dl.kv", null,
        h("dt", null, "Title"), h("dd", null, t.title || "—"),
        h("dt", null, "Type"), h("dd", null, t.type || "—"),
        h("dt", null, "Status"), h("dd", null, t.status || "—"),
        h("dt", null, "Closed"), h("dd", null, t.closed ? "yes" : "no"),
        h("dt", null, "Tags"), h("dd", null, (t.tags || []).map((tag) => h("span.tag", null, tag))),
        h("dt", null, "Assignee"), h("dd", null, t.assignee ? t.assignee.name : "unassigned"),
        h("dt", null, "Created"), h("dd", null, when(t.created_at))),
        h("details", null, h("summary", null, "Fields"), h("pre", null, JSON.stringify(t.fields, null, 2))))));
  }
  await load();
  const refresh = debounce(() => load().catch(() => {}), 300);
  onLive((type, data) => (type === "reload" || (type === "ticket.updated" && data.ticket_id === id)) && refresh());
};

// ---------- Incidents ----------

pages.incidents = async (view) => {
  $("#title").textContent = "Incidents";
  async function load() {
    const items = (await api("/api/incidents?limit=100")).items;
    fill(view, items.length ? h("div.stack", { id: "incidents" }, items.map((i) => h("div.card.stack", null,
      h("div.attempt-head", null, pill(i.status), h("strong", null, i.title), h("span.muted", null, when(i.created_at)),
        i.occurrences > 1 ? h("span.muted", null, `${i.occurrences} times`) : null,
        i.status === "open" && allows("write") ? h("div.actions", null, h("button.button.small", { onclick: () => resolve(i.id) }, "Resolve")) : null),
      h("div", null, i.impact),
      i.detail ? h("details", null, h("summary", null, "Detail (platform admin)"),
        i.run_id ? h("p", null, "Run ", h("a", { href: `#/runs/${i.run_id}` }, i.run_id)) : null,
        h("pre", null, JSON.stringify(i.detail, null, 2))) : null)))
      : h("div.card.empty", null, "No incidents. When a run fails for good, its incident shows here."));
  }
  async function resolve(incident) {
    try {
      await api(`/api/incidents/${encodeURIComponent(incident)}/resolve`, { method: "POST" });
      await load();
    } catch (e) {
      flash(e.message);
    }
  }
  await load();
  const refresh = debounce(() => load().catch(() => {}), 300);
  onLive((type) => (type === "incident.opened" || type === "incident.updated" || type === "reload") && refresh());
};

// ---------- Approvals ----------

pages.approvals = async (view) => {
  $("#title").textContent = "Approvals";
  const filter = h("select", { id: "approvals-filter", onchange: () => load().catch((e) => flash(e.message)) },
    h("option", { value: "pending" }, "Waiting for a decision"), h("option", { value: "all" }, "All"));
  const list = h("div.stack", { id: "approvals" });
  view.append(h("div.stack", null, h("div.toolbar", null, h("div.field", null, h("label", { for: "approvals-filter" }, "Show"), filter)), list));

  function decisionForm(a) {
    const member = h("select", { name: "member", "aria-label": "Decide as" },
      a.approvers.map((p) => h("option", { value: p.id }, p.name)));
    const comment = h("input", { name: "comment", type: "text", placeholder: "Comment (optional)", "aria-label": "Comment" });
    const decide = async (decision, button) => {
      button.disabled = true;
      try {
        const body = { decision, member: member.value };
        if (comment.value.trim()) body.comment = comment.value.trim();
        await api(`/api/approvals/${encodeURIComponent(a.id)}`, { method: "POST", body });
        flash(decision === "approve" ? "Approved: the run goes on." : "Rejected: the run goes on with the rejection.", true);
        await load();
      } catch (e) {
        button.disabled = false;
        flash(e.message);
      }
    };
    const approve = h("button.button.primary", { type: "button", dataset: { decide: "approve" }, onclick: () => decide("approve", approve) }, "Approve");
    const reject = h("button.button", { type: "button", dataset: { decide: "reject" }, onclick: () => decide("reject", reject) }, "Reject");
    return h("div.decide", null, h("label", null, "As ", member), comment, approve, reject);
  }

  async function load() {
    const items = await all(`/api/approvals?status=${filter.value}`);
    fill(list, items.length ? items.map((a) => h("div.card.stack.approval", { dataset: { approval: a.id } },
      h("div.attempt-head", null, pill(a.status), h("strong", null, a.prompt), h("span.muted", null, when(a.created_at)),
        h("div.actions", null, h("a.button.small", { href: `#/runs/${a.run_id}` }, "Its run"))),
      h("dl.kv", null,
        h("dt", null, "Automation"), h("dd", null, automationNames.get(a.automation_id) || a.automation_id, h("span.muted", null, ` · step ${a.step_id}`)),
        h("dt", null, "Approvers"), h("dd", null, a.approvers.map((p) => p.name).join(", ")),
        a.decided_by ? [h("dt", null, "Decided"), h("dd.decided", null, `${a.status} by ${a.decided_by.name} `, when(a.decided_at),
          a.comment ? h("span.muted", null, ` · “${a.comment}”`) : null)] : null),
      a.status === "pending" && allows("write") ? decisionForm(a) : null))
      : h("div.card.empty", null, filter.value === "pending"
        ? "Nothing waits for a decision. A run's approval step shows here until an approver decides."
        : "No approvals yet."));
  }
  await loadAutomations();
  await load();
  const refresh = debounce(() => load().catch(() => {}), 300);
  onLive((type) => (type === "run.updated" || type === "reload") && refresh());
};

// ---------- Keys ----------

const SCOPES = [
  ["read", "Read: every listing and detail"],
  ["write", "Write: create and change resources, act on runs (grants read and signal)"],
  ["signal", "Signal: send signals and start runs, nothing else"],
  ["admin", "Admin: everything, and these keys"],
];

pages.keys = async (view) => {
  $("#title").textContent = "API keys";
  const name = h("input", { id: "key-name", type: "text", placeholder: "What the key is for", required: true, maxlength: 100 });
  const boxes = SCOPES.map(([scope, label]) => h("label.check", null,
    h("input", { type: "checkbox", name: "scope", value: scope, checked: scope === "read" }), ` ${label}`));
  const expires = h("input", { id: "key-expires", type: "date", "aria-label": "Expires on" });
  const made = h("div", { id: "key-made" });
  const form = h("form.card.stack", { id: "key-form", onsubmit: (e) => { e.preventDefault(); create().catch((err) => flash(err.message)); } },
    h("h2", null, "New key"),
    h("div.field", null, h("label", { for: "key-name" }, "Name"), name),
    h("fieldset.field", null, h("legend", null, "Scopes"), ...boxes),
    h("div.field", null, h("label", { for: "key-expires" }, "Expires (optional)"), expires),
    h("div", null, h("button.button.primary", { id: "key-create", type: "submit" }, "Create key")),
    made);
  const table = h("div.card.table-card");
  view.append(h("div.stack", null, form, table));

  async function create() {
    const scopes = boxes.map((b) => b.querySelector("input")).filter((i) => i.checked).map((i) => i.value);
    const body = { name: name.value.trim(), scopes };
    if (expires.value) body.expires_at = new Date(`${expires.value}T23:59:59Z`).toISOString();
    const key = await api("/api/keys", { method: "POST", body });
    const secret = h("input", { id: "key-secret", readonly: true, value: key.key });
    const copy = h("button.button.primary", { type: "button", id: "key-copy", onclick: () => copyText(key.key, copy) }, "Copy");
    fill(made, h("div.card.stack.made", null,
      h("strong", null, `Key “${key.name}” made. Copy it now: it is not shown again.`),
      h("div.url-row", null, secret, copy)));
    name.value = "";
    await load();
  }

  // The first click asks, the second revokes.
  const revoke = (key, button) => twice(button, "Click again to revoke", async () => {
    await api(`/api/keys/${encodeURIComponent(key.id)}`, { method: "DELETE" });
    flash(`Key “${key.name}” revoked.`, true);
    await load();
  });

  async function load() {
    const keys = await all("/api/keys");
    fill(table, h("table", { id: "keys" },
      h("thead", null, h("tr", null, ["Name", "Scopes", "Created", "Expires", "Last used", ""].map((c) => h("th", null, c)))),
      h("tbody", null, keys.map((k) => h("tr", { dataset: { key: k.id } },
        h("td", null, k.name),
        h("td", null, k.scopes.join(", ")),
        h("td", null, when(k.created_at)),
        h("td", null, k.expired ? h("span.pill.failed", null, "expired") : k.expires_at ? until(k.expires_at) : h("span.muted", null, "never")),
        h("td", null, k.last_used_at ? when(k.last_used_at) : h("span.muted", null, "never")),
        h("td", null, h("button.button.small", { type: "button", dataset: { revoke: k.id }, onclick: (e) => revoke(k, e.currentTarget) }, "Revoke")))))));
  }
  await load();
};

// ---------- Audit ----------

// Who changed what with which key. The platform admin with no tenant
// picked sees every tenant's rows and the platform's own.
const auditFilters = { actor: "", action: "", target: "", since: "" };

pages.audit = async (view) => {
  $("#title").textContent = "Audit log";
  const everyone = session.kind === "admin" && !session.tenant;
  const input = (name, label, attrs) => h("div.field", null, h("label", { for: `audit-${name}` }, label),
    h("input", { id: `audit-${name}`, value: auditFilters[name], ...attrs,
      onchange: (e) => { auditFilters[name] = e.target.value.trim(); load().catch((err) => flash(err.message)); } }));
  const keys = h("datalist", { id: "audit-keys" });
  const toolbar = h("form.toolbar", { id: "audit-filters", onsubmit: (e) => e.preventDefault() },
    input("actor", "Key (id)", { type: "text", list: "audit-keys", placeholder: "key_…", spellcheck: "false" }),
    input("action", "Action", { type: "text", placeholder: "automation.saved", spellcheck: "false" }),
    input("target", "Target (id)", { type: "text", spellcheck: "false" }),
    input("since", "Since", { type: "date" }),
    h("div.field", null, h("button.button.small", { id: "audit-refresh", type: "button", onclick: () => load().catch((err) => flash(err.message)) }, "Refresh")),
    keys);
  const table = h("div.card.table-card");
  view.append(h("div.stack", null, toolbar, table));
  if (!everyone) {
    // The keys' names as suggestions; a revoked key's id still filters.
    all("/api/keys").then((list) => fill(keys, list.map((k) => h("option", { value: k.id }, k.name)))).catch(() => {});
  }
  let cursor = null;

  const who = (actor) => h("span", { title: actor.id || "" },
    actor.name || actor.id || actor.kind, h("span.muted", null, actor.kind === "key" ? "" : ` (${actor.kind})`));

  function row(entry) {
    return h("tr", { dataset: { audit: entry.id, action: entry.action, target: entry.target.id || "" } },
      h("td", null, when(entry.at)),
      h("td", null, who(entry.actor)),
      h("td.mono", null, entry.action),
      h("td", null, entry.target.kind, " ", h("span.mono", { title: entry.target.id || "" }, short(entry.target.id))),
      everyone ? h("td.mono", { title: entry.tenant_id || "" }, entry.tenant_id ? short(entry.tenant_id) : "platform") : null,
      h("td", null, entry.summary || ""));
  }

  async function load(more = false) {
    const query = new URLSearchParams({ limit: "50" });
    for (const [k, v] of Object.entries(auditFilters)) {
      if (!v) continue;
      query.set(k, k === "since" ? new Date(`${v}T00:00:00Z`).toISOString() : v);
    }
    if (more && cursor) query.set("cursor", cursor);
    const page = await api(`/api/audit?${query}`);
    cursor = page.next_cursor;
    let body = $("tbody", table);
    if (!body) {
      body = h("tbody");
      const heads = ["When", "Who", "Action", "Target", everyone ? "Tenant" : null, "Summary"].filter(Boolean);
      fill(table, h("table", { id: "audit" }, h("thead", null, h("tr", null, heads.map((c) => h("th", null, c)))), body));
    }
    const drawn = page.items.map(row);
    if (more) body.append(...drawn);
    else fill(body, drawn);
    for (const extra of table.querySelectorAll(".empty, .more")) extra.remove();
    if (!body.children.length) table.append(h("div.empty", null, "No changes match. Every change made with a key shows up here."));
    if (cursor) table.append(h("div.more", null, h("button.button.small", { id: "audit-more", onclick: () => load(true).catch((err) => flash(err.message)) }, "Load more")));
  }

  await load();
};

// ---------- Queue health ----------

const SVG = "http://www.w3.org/2000/svg";

function svg(tag, attrs, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
  for (const child of children) el.append(child);
  return el;
}

/** A round upper bound for a chart's axis: 1, 2, 5, 10, 20, 50… */
function niceMax(v) {
  if (!(v > 0)) return 1;
  const step = 10 ** Math.floor(Math.log10(v));
  return [1, 2, 5, 10].map((m) => m * step).find((m) => m >= v);
}

const axisNumber = (v) => (v >= 1000 ? `${+(v / 1000).toFixed(1)}k` : `${+v.toFixed(2)}`);
const clock = (ms) => new Date(ms).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" });

/**
 * A line (or bar) chart of `points` ({at: ms, <key>: number|null}) between
 * `from` and `to` (ms), one series per {key, label, color}, drawn as SVG by
 * hand. A sample more than `gap` ms after the one before starts a new line,
 * so a time nobody sampled is not drawn as a slope. Hovering shows the
 * values of the nearest sample in the chart's readout.
 */
function chart({ name, title, unit, series, points, from, to, gap, bars = false }) {
  const W = 600, H = 170, L = 44, R = 10, T = 10, B = 22;
  const x = (at) => L + ((at - from) / Math.max(1, to - from)) * (W - L - R);
  const values = points.flatMap((p) => series.map((s) => p[s.key])).filter((v) => typeof v === "number");
  const max = niceMax(Math.max(0, ...values));
  const y = (v) => H - B - (v / max) * (H - T - B);
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", "data-chart": name, role: "img", "aria-label": title });
  for (const f of [0, 0.5, 1]) {
    const v = max * f;
    root.append(svg("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), class: "grid" }),
      svg("text", { x: L - 6, y: y(v) + 4, class: "axis", "text-anchor": "end" }, axisNumber(v)));
  }
  const minutes = Math.round((to - from) / 60000);
  for (const f of [0, 0.25, 0.5, 0.75, 1]) {
    const at = from + (to - from) * f;
    const label = f === 1 ? "now" : `−${Math.round(minutes * (1 - f))}m`;
    root.append(svg("text", { x: x(at), y: H - 6, class: "axis", "text-anchor": f === 0 ? "start" : f === 1 ? "end" : "middle" }, label));
  }
  for (const s of series) {
    const drawn = points.filter((p) => typeof p[s.key] === "number");
    if (bars) {
      const width = Math.max(1.5, ((W - L - R) / Math.max(1, (to - from) / gap)) * 0.6);
      const group = svg("g", { "data-series": s.key, "data-points": drawn.length, fill: s.color });
      for (const p of drawn) {
        if (p[s.key] > 0) group.append(svg("rect", { x: x(p.at) - width / 2, y: y(p[s.key]), width, height: H - B - y(p[s.key]) }));
      }
      root.append(group);
      continue;
    }
    let d = "";
    drawn.forEach((p, i) => {
      const move = i === 0 || p.at - drawn[i - 1].at > gap;
      d += `${move ? "M" : "L"}${x(p.at).toFixed(1)},${y(p[s.key]).toFixed(1)} `;
    });
    root.append(svg("path", { d: d.trim(), fill: "none", stroke: s.color, "stroke-width": 2, "stroke-linejoin": "round",
      "vector-effect": "non-scaling-stroke", "data-series": s.key, "data-points": drawn.length }));
    const last = drawn[drawn.length - 1];
    if (last) root.append(svg("circle", { cx: x(last.at), cy: y(last[s.key]), r: 3, fill: s.color }));
  }
  const cursor = svg("line", { y1: T, y2: H - B, class: "cursor", visibility: "hidden" });
  root.append(cursor);
  const readout = h("span.readout", null, "");
  root.addEventListener("mousemove", (e) => {
    if (!points.length) return;
    const box = root.getBoundingClientRect();
    const at = from + ((e.clientX - box.left) / box.width * W - L) / (W - L - R) * (to - from);
    const near = points.reduce((a, b) => (Math.abs(b.at - at) < Math.abs(a.at - at) ? b : a));
    cursor.setAttribute("x1", x(near.at));
    cursor.setAttribute("x2", x(near.at));
    cursor.setAttribute("visibility", "visible");
    readout.textContent = `${clock(near.at)} · ` + series.map((s) =>
      `${s.label} ${typeof near[s.key] === "number" ? axisNumber(near[s.key]) : "—"}`).join(" · ");
  });
  root.addEventListener("mouseleave", () => {
    cursor.setAttribute("visibility", "hidden");
    readout.textContent = "";
  });
  // Colours through the CSSOM: the page's policy refuses style attributes.
  const swatch = (color) => {
    const i = h("i");
    i.style.background = color;
    return i;
  };
  const legend = series.length > 1 ? h("div.legend", null, series.map((s) => h("span", null, swatch(s.color), s.label))) : null;
  return h("div.card.chart-card", { dataset: { chart: name } },
    h("div.chart-head", null, h("h2", null, title, unit ? h("span.muted", null, ` (${unit})`) : null), readout),
    legend, root);
}

pages.queue = async (view) => {
  $("#title").textContent = "Queue health";
  const tiles = h("div.tiles", { id: "queue-tiles" });
  const range = h("select", { id: "queue-range" },
    [[15, "Last 15 minutes"], [60, "Last hour"], [360, "Last 6 hours"], [1440, "Last 24 hours"]]
      .map(([m, label]) => h("option", { value: m, selected: m === 60 }, label)));
  const charts = h("div.charts", { id: "queue-charts" });
  const note = h("p.note");
  const recent = h("div.tiles");
  view.append(h("div.stack", null, tiles,
    h("div.toolbar.chart-toolbar", null, h("h3", null, "Over time"), range), charts,
    h("h3", null, "Runs in the last hour"), recent, note));

  let history = { samples: [], sample_every_s: 30, minutes: 60 };
  // What this page sampled itself since the last stored sample: the newest point.
  let fresh = [];

  function draw() {
    const to = Date.now();
    const from = to - history.minutes * 60e3;
    const stored = history.samples.map((s) => ({ ...s, at: toDate(s.at).getTime() }));
    const newest = stored.length ? stored[stored.length - 1].at : -Infinity;
    fresh = fresh.filter((p) => p.at > newest && p.at >= from);
    const points = stored.concat(fresh).filter((p) => p.at >= from);
    const gap = Math.max(3 * history.sample_every_s * 1000, 90e3);
    const at = { points, from, to, gap };
    if (!stored.length && !fresh.length) {
      fill(charts, h("div.card.empty", null,
        `No samples yet: the node running the scheduler keeps one every ${history.sample_every_s} s.`));
    } else {
      fill(charts,
        chart({ name: "depth", title: "Queue depth", unit: "jobs", ...at, series: [
          { key: "ready", label: "Ready", color: "#3b5bdb" },
          { key: "running", label: "Running", color: "#2b8a3e" },
          { key: "scheduled", label: "Scheduled", color: "#b76e00" },
          { key: "pending_events", label: "Events not dispatched", color: "#ae3ec9" },
        ] }),
        chart({ name: "oldest", title: "Oldest ready job", unit: "seconds waited", ...at, series: [
          { key: "oldest_ready_s", label: "Oldest", color: "#c92a2a" }] }),
        chart({ name: "throughput", title: "Steps per second", ...at, points: stored, series: [
          { key: "steps_per_s", label: "Steps/s", color: "#1c7ed6" }] }),
        chart({ name: "failures", title: "Failed step attempts", unit: "per sample", ...at, points: stored, bars: true, series: [
          { key: "steps_failed", label: "Failed", color: "#c92a2a" }] }));
    }
    fill(note, `One sample every ${history.sample_every_s} s, kept a day by the node that runs the scheduler ` +
      "(TOK_QUEUE_SAMPLE_EVERY); the newest point of the depth and age charts is what this page read " +
      "just now. Steps per second and failed attempts count the steps recorded between two samples. " +
      "The platform's Prometheus figures are at /metrics.");
  }

  async function loadHistory() {
    history = await api(`/api/dashboard/queue/history?minutes=${range.value}`);
    draw();
  }

  async function now() {
    const q = await api("/api/dashboard/queue");
    const tile = (label, value) => h("div.tile", null, h("div.label", null, label), h("div.value", null, value));
    fill(tiles,
      tile("Ready jobs", q.ready),
      tile("Running", q.running),
      tile("Scheduled (retries, waits)", q.scheduled),
      tile("Events not yet dispatched", q.pending_events),
      tile("Oldest ready job", q.oldest_ready_s === null ? "—" : `${q.oldest_ready_s.toFixed(1)} s`));
    fresh.push({ ...q, at: toDate(q.sampled_at).getTime() });
    draw();
  }

  async function counts() {
    const since = Date.now() - 3600e3;
    const tally = {};
    for (const status of ["completed", "failed", "running", "waiting"]) {
      const page = await api(`/api/dashboard/runs?status=${status}&limit=500`);
      tally[status] = page.items.filter((r) => (toDate(r.created_at) || 0) >= since).length + (page.next_cursor ? "+" : "");
    }
    fill(recent, ...Object.entries(tally).map(([k, v]) => h("div.tile", null, h("div.label", null, k), h("div.value", null, v))));
  }

  range.addEventListener("change", () => loadHistory().catch((e) => flash(e.message)));
  await loadHistory();
  await Promise.all([now(), counts()]);
  const live = setInterval(() => now().catch(() => {}), 5000);
  const stored = setInterval(() => loadHistory().catch(() => {}), Math.max(2000, history.sample_every_s * 1000));
  leaving = () => {
    clearInterval(live);
    clearInterval(stored);
  };
  const refresh = debounce(() => counts().catch(() => {}), 1000);
  onLive((type) => type === "run.updated" && refresh());
};

// ---------- start ----------

document.addEventListener("DOMContentLoaded", () => {
  $("#signin-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const error = $("#signin-error");
    error.hidden = true;
    try {
      await signIn($("#signin-key").value.trim());
    } catch (err) {
      session.key = null;
      error.textContent = err.status === 401 ? "That API key is not valid." : err.message;
      error.hidden = false;
    }
  });
  $("#signout").addEventListener("click", signOut);
  $("#tenant-pick").addEventListener("change", (e) => {
    session.tenant = e.target.value || null;
    if (session.tenant) sessionStorage.setItem("tok.tenant", session.tenant);
    signIn(session.key).catch((err) => flash(err.message));
  });
  window.addEventListener("hashchange", route);
  if (session.key) {
    signIn(session.key).catch(() => signOut());
  } else {
    $("#signin").hidden = false;
  }
});
