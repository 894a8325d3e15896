// tok's dashboard, the Widgets page: one tile per widget with the data its
// request last answered, how old that data is, a Refresh button, and (for
// a key that may write) a Delete button that asks for a second click. The
// page asks for each widget's data once; tok answers from its cache while
// that is fresh, so opening the page calls no outside service. Loaded after
// app.js, whose helpers it uses.
"use strict";

/** How a widget's data reads on its tile: a number or text as a value, an
 * object as its first fields, anything else as JSON. */
function widgetBody(data) {
  if (data === null || data === undefined) return h("div.value.muted", null, "—");
  if (typeof data === "number" || typeof data === "boolean") return h("div.value", null, String(data));
  if (typeof data === "string") {
    return data.length <= 24 ? h("div.value", null, data) : h("div.widget-text", null, data.slice(0, 400));
  }
  if (!Array.isArray(data) && typeof data === "object") {
    const entries = Object.entries(data);
    if (entries.length === 1 && typeof entries[0][1] !== "object") {
      return h("div", null, h("div.value", null, String(entries[0][1])), h("div.label", null, entries[0][0]));
    }
    return h("dl.widget-fields", null, entries.slice(0, 6).flatMap(([k, v]) =>
      [h("dt", null, k), h("dd", null, typeof v === "object" ? JSON.stringify(v) : String(v))]));
  }
  return h("pre.widget-text", null, JSON.stringify(data, null, 2).slice(0, 400));
}

function ageText(seconds) {
  if (seconds < 5) return "just now";
  if (seconds < 60) return `${seconds}s ago`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)}m ago`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)}h ago`;
  return `${Math.floor(seconds / 86400)}d ago`;
}

pages.widgets = async (view) => {
  $("#title").textContent = "Widgets";
  const widgets = await all("/api/widgets");
  if (!widgets.length) {
    view.append(h("div.card.empty", null,
      "No widgets yet. A widget shows what one request to a connection answers, cached for its ttlSec: ",
      h("code", null, 'POST /api/widgets {"name": "Open orders", "connection": "shop", "request": {"url": "/orders?status=open"}, "ttlSec": 300}')));
    return;
  }
  const tiles = h("div.tiles.widgets", { id: "widgets" });
  view.append(tiles, h("p.note", null,
    "Each tile's data comes from tok's cache while it is younger than the widget's time to live; " +
    "Refresh asks the service again."));
  /** When each tile's data was fetched (ms), for the age shown. */
  const fetched = new Map();

  function drawAge(tile, id) {
    const at = fetched.get(id);
    const age = tile.querySelector(".widget-age");
    if (age && at !== undefined) age.textContent = `fetched ${ageText(Math.max(0, Math.floor((Date.now() - at) / 1000)))}`;
  }

  async function load(widget, tile, refresh) {
    const button = tile.querySelector(".widget-refresh");
    button.disabled = true;
    try {
      const d = await api(`/api/widgets/${widget.id}/data${refresh ? "?refresh=true" : ""}`);
      // The server's age, so the browser's clock does not matter.
      fetched.set(widget.id, Date.now() - d.age_s * 1000);
      tile.dataset.cached = String(d.cached);
      fill(tile.querySelector(".widget-body"), widgetBody(d.data));
      fill(tile.querySelector(".widget-meta"),
        h("span.widget-age", { title: d.fetched_at }), " · ",
        h("span.widget-source", null, d.cached ? "from the cache" : "just fetched"));
      drawAge(tile, widget.id);
      fill(tile.querySelector(".widget-error"), d.error ? `Refresh failed: ${d.error}` : null);
    } catch (e) {
      fill(tile.querySelector(".widget-error"), e.message);
    } finally {
      button.disabled = false;
    }
  }

  // The first click asks, the second deletes the widget and its tile.
  const remove = (widget, tile, button) => twice(button, "Click again to delete", async () => {
    await api(`/api/widgets/${encodeURIComponent(widget.id)}`, { method: "DELETE" });
    tile.remove();
    flash(`Widget “${widget.name}” deleted.`, true);
  });

  for (const widget of widgets) {
    const tile = h("div.tile.widget", { dataset: { widget: widget.id } },
      h("div.widget-head", null, h("div.label", null, widget.name),
        h("div.actions", null,
          h("button.button.small.widget-refresh", { type: "button", title: "Ask the service again" }, "Refresh"),
          allows("write") ? h("button.button.small.widget-delete", { type: "button", dataset: { deleteWidget: widget.id },
            onclick: (e) => remove(widget, tile, e.currentTarget) }, "Delete") : null)),
      h("div.widget-body", null, h("div.value.muted", null, "…")),
      h("div.widget-meta.note"),
      h("div.widget-error.error-text"));
    tile.querySelector(".widget-refresh").addEventListener("click", () => load(widget, tile, true));
    tiles.append(tile);
    load(widget, tile, false);
  }
  const timer = setInterval(() => {
    for (const tile of tiles.children) drawAge(tile, tile.dataset.widget);
  }, 5000);
  leaving = () => clearInterval(timer);
};
