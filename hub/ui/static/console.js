// Quire's web console: polls the admin API every 2 s and updates the page in place.
// Every value from the server is set with textContent (never innerHTML): names are user input.
"use strict";

(function () {
  const BASE = document.body.dataset.base || "";
  const PAGE = document.body.dataset.page || "";
  const TOKEN_KEY = "quire-admin-token";
  const POLL_MS = 2000;
  const CHART_POINTS = 90;  // 3 minutes at one sample every 2 s

  // --- formatting: the same as hub.ui.pages._format ------------------------------------------
  function format(value, fmt) {
    if (value === null || value === undefined || value === "") return fmt === "text" || !fmt ? "" : "\u2014";
    switch (fmt) {
      case "rate": return Number(value).toFixed(1) + "/s";
      case "pct": return (Number(value) * 100).toFixed(1) + "%";
      case "ms": return Number(value).toFixed(2) + " ms";
      case "bytes": {
        let n = Number(value);
        const units = ["B", "KiB", "MiB", "GiB", "TiB"];
        for (let i = 0; i < units.length; i++) {
          if (n < 1024 || i === units.length - 1) return i === 0 ? n.toFixed(0) + " B" : n.toFixed(1) + " " + units[i];
          n /= 1024;
        }
        return String(value);
      }
      case "time": return new Date(Number(value)).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
      case "list": return Array.isArray(value) ? value.join(", ") : String(value);
      case "consumers":
        if (Array.isArray(value)) {
          return String(value.length) + (value.length ? ": " + value.map((c) => (c && typeof c === "object")
            ? (c.address || "?") + " (" + (c.unacked || 0) + " unacked)" : String(c)).join(", ") : "");
        }
        return String(value);
      case "count": return Array.isArray(value) ? String(value.length)
        : (typeof value === "object" ? String(Object.keys(value).length) : String(value));
      case "bool": return value ? "yes" : "no";
      case "json": return typeof value === "string" ? value : JSON.stringify(value);
      default: return String(value);
    }
  }

  // as Python's urllib.parse.quote(s, safe=""), so the server's links and the script's are the same
  const enc = (s) => encodeURIComponent(s).replace(/[!'()*]/g, (c) => "%" + c.charCodeAt(0).toString(16).toUpperCase());

  function rowsOf(value) {
    if (value && !Array.isArray(value) && typeof value === "object") {
      return Object.keys(value).map((k) => (value[k] && typeof value[k] === "object")
        ? Object.assign({name: k}, value[k]) : {name: k, value: value[k]});
    }
    return (value || []).map((v) => (v && typeof v === "object") ? v : {value: v});
  }

  function rowKey(row, key) {
    return key.split(",").map((k) => (row[k] === undefined || row[k] === null) ? "" : String(row[k])).join("|");
  }

  function pick(data, path) {
    if (!path) return data;
    return path.split(".").reduce((d, k) => (d === null || d === undefined) ? undefined : d[k], data);
  }

  function el(tag, attrs, text) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  // --- tables: the <th> says the field and format of each column (hub.ui.pages.COLUMNS) ---------
  function actionCell(td, fmt, value, row) {
    if (fmt === "actions:sub") {
      td.append(el("input", {type: "text", class: "seq", placeholder: "seq id or time",
                             "aria-label": "reset " + value + " to a seq id or a time"}), " ",
                el("button", {type: "button", "data-action": "reset", "data-arg": value}, "Reset"), " ",
                el("button", {type: "button", "data-action": "delete-sub", "data-arg": value, class: "danger"},
                   "Delete"));
    } else if (fmt === "actions:bookie") {
      td.append(el("button", {type: "button", "data-action": "readonly", "data-arg": row.address, "data-value": value},
                   value === "read_only" ? "Make writable" : "Make read-only"));
    } else if (fmt === "actions:policy") {
      td.append(el("button", {type: "button", "data-action": "delete-policy", "data-arg": value, class: "danger"},
                   "Delete"));
    } else if (fmt === "actions:grant") {
      td.append(el("button", {type: "button", "data-action": "revoke", "data-arg": row.role,
                              "data-arg2": row.prefix, class: "danger"}, "Revoke"));
    }
  }

  function fillCell(td, col, row) {
    const value = row[col.field];
    if (col.fmt.startsWith("actions:")) {
      const button = td.querySelector("button[data-value]");
      if (button && button.dataset.value === String(value)) return;     // keep what the user typed
      if (td.querySelector("input") && col.fmt === "actions:sub") return;
      td.replaceChildren();
      actionCell(td, col.fmt, value, row);
    } else if (col.link === "topic") {
      const href = BASE + "/ui/topics/" + enc(value), text = format(value, col.fmt);
      const a = td.querySelector("a");
      if (a && a.getAttribute("href") === href && a.textContent === text) return;   // unchanged: keep the node
      td.replaceChildren(el("a", {href}, text));
    } else {
      td.textContent = format(value, col.fmt);
    }
  }

  function syncTable(table, data) {
    const cols = Array.from(table.tHead.rows[0].cells).map((th) => ({
      field: th.dataset.field, fmt: th.dataset.fmt || "text", link: th.dataset.link || ""}));
    const rows = rowsOf(pick(data, table.dataset.from));
    const body = table.tBodies[0];
    const existing = new Map();
    for (const tr of Array.from(body.rows)) {
      if (tr.classList.contains("empty")) tr.remove(); else existing.set(tr.dataset.key, tr);
    }
    for (const row of rows) {
      const key = rowKey(row, table.dataset.key);
      let tr = existing.get(key);
      if (tr) existing.delete(key);
      else {
        tr = el("tr", {"data-key": key});
        cols.forEach(() => tr.append(el("td")));
      }
      cols.forEach((col, i) => fillCell(tr.cells[i], col, row));
      body.append(tr);     // moves an existing row: keeps the order of the answer
    }
    existing.forEach((tr) => tr.remove());
    if (!rows.length) {
      const td = el("td", {colspan: String(cols.length)}, table.dataset.empty || "none");
      const tr = el("tr", {class: "empty"});
      tr.append(td);
      body.append(tr);
    }
  }

  // --- the live chart (inline SVG) ----------------------------------------------------------
  function drawChart(svg, value) {
    // the samples of this topic in this tab, kept across reloads for the chart's span (sessionStorage)
    const holder = document.querySelector("[data-topic]");
    const key = "quire-rate:" + (holder ? holder.dataset.topic : "");
    const span = CHART_POINTS * POLL_MS, now = Date.now();
    let samples = [];
    try { samples = JSON.parse(sessionStorage.getItem(key) || "[]"); } catch (e) { samples = []; }
    samples = samples.filter((s) => Array.isArray(s) && now - s[0] < span);
    samples.push([now, Number(value) || 0]);
    sessionStorage.setItem(key, JSON.stringify(samples));
    const NS = "http://www.w3.org/2000/svg";
    const w = 600, h = 120, left = 48, top = 8, bottom = 18;
    const max = Math.max(1, ...samples.map((s) => s[1]));
    const x = (t) => left + (w - left - 4) * (1 - (now - t) / span);
    const y = (v) => top + (h - top - bottom) * (1 - v / max);
    const shape = (tag, attrs, text) => {
      const n = document.createElementNS(NS, tag);
      for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, String(v));
      if (text !== undefined) n.textContent = text;
      return n;
    };
    const points = samples.map((s) => `${x(s[0]).toFixed(1)},${y(s[1]).toFixed(1)}`).join(" ");
    svg.replaceChildren(
      shape("line", {x1: left, y1: y(0), x2: w - 4, y2: y(0), class: "axis"}),
      shape("line", {x1: left, y1: top, x2: left, y2: y(0), class: "axis"}),
      shape("text", {x: left - 4, y: top + 8, class: "label", "text-anchor": "end"}, format(max, "rate")),
      shape("text", {x: left - 4, y: y(0), class: "label", "text-anchor": "end"}, "0"),
      shape("text", {x: left + 2, y: h - 4, class: "label"}, "-3 min"),
      shape("text", {x: w - 4, y: h - 4, class: "label", "text-anchor": "end"}, "now"),
      shape("polyline", {points: points, class: "rate", "data-samples": samples.length}));
  }

  // --- polling ------------------------------------------------------------------------------
  function render(section, data) {
    section.querySelectorAll("table[data-from]").forEach((t) => syncTable(t, data));
    section.querySelectorAll("[data-field]:not(th)").forEach((node) => {
      const value = pick(data, node.dataset.field);
      node.textContent = node.dataset.fmt ? format(value, node.dataset.fmt)
        : (value === null || value === undefined ? "\u2014" : String(value));
    });
    section.querySelectorAll("[data-list]").forEach((list) => {
      const items = pick(data, list.dataset.list) || [];
      list.replaceChildren(...items.map((text) => el("li", {}, text)));
      list.hidden = items.length === 0;
    });
    section.querySelectorAll("svg[data-chart]").forEach((svg) => drawChart(svg, pick(data, svg.dataset.chart)));
  }

  async function poll(section) {
    try {
      const resp = await fetch(BASE + section.dataset.poll, {cache: "no-store"});
      const data = await resp.json();
      if (resp.ok) {
        render(section, data);
        document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
      } else if (resp.status === 404 && section.dataset.topic !== undefined) {
        document.getElementById("updated").textContent = "no such topic: " + section.dataset.topic + " (deleted?)";
      } else {
        show((data && data.error) || ("HTTP " + resp.status), true);
      }
    } catch (err) {
      show("cannot reach the hub: " + err, true);
    }
  }

  // --- changes: through the admin API, with the admin token when the hub asks for it -----------
  function show(text, isError) {
    const p = document.getElementById("message");
    p.textContent = text;
    p.className = isError ? "error" : "ok";
    p.hidden = false;
  }

  function tokenState() {
    const has = !!sessionStorage.getItem(TOKEN_KEY);
    document.getElementById("token-state").textContent = has ? "admin token kept for this tab" : "no admin token";
    document.getElementById("forget-token").hidden = !has;
  }

  async function change(method, path, body) {
    for (let attempt = 0; attempt < 2; attempt++) {
      const token = sessionStorage.getItem(TOKEN_KEY);
      const headers = {};
      if (token) headers.Authorization = "Bearer " + token;
      if (body !== undefined) headers["Content-Type"] = "application/json";
      let resp;
      try {
        resp = await fetch(BASE + path, {method, headers, body: body === undefined ? undefined : JSON.stringify(body)});
      } catch (err) {
        show("cannot reach the hub: " + err, true);
        return null;
      }
      const text = await resp.text();
      let data = null;
      try { data = JSON.parse(text); } catch (e) { data = {error: text}; }
      if (resp.status === 401) {
        sessionStorage.removeItem(TOKEN_KEY);
        tokenState();
        if (attempt === 0) {
          const given = window.prompt("This change needs the hub's admin token (kept for this browser tab only):");
          if (given) { sessionStorage.setItem(TOKEN_KEY, given.trim()); tokenState(); continue; }
        }
      }
      if (!resp.ok) {
        show("refused (" + resp.status + "): " + ((data && data.error) || text), true);
        return null;
      }
      return data;
    }
    return null;
  }

  function topicPath() {
    const holder = document.querySelector("[data-topic]");
    return "/admin/v1/topics/" + enc(holder.dataset.topic);
  }

  async function act(button) {
    const action = button.dataset.action, arg = button.dataset.arg;
    let done = null;
    if (action === "forget-token") {
      sessionStorage.removeItem(TOKEN_KEY);
      tokenState();
      show("admin token forgotten", false);
      return;
    } else if (action === "reset") {
      // a whole number is a seq id; anything else is a time (ISO 8601; no zone means the browser's)
      const text = button.closest("td").querySelector("input.seq").value.trim();
      let body, what;
      if (/^[0-9]+$/.test(text)) {
        const seq = parseInt(text, 10);
        if (!(seq >= 1)) { show("give the seq id to reset " + arg + " to (1 or more)", true); return; }
        body = {seq_id: seq}; what = "seq id " + seq;
      } else {
        const ms = Date.parse(text);
        if (isNaN(ms) || ms < 0) {
          show("give a seq id (1 or more) or a time such as 2026-11-28T09:30:00Z to reset " + arg + " to", true);
          return;
        }
        body = {publish_time_ms: ms}; what = "time " + new Date(ms).toISOString();
      }
      done = await change("POST", topicPath() + "/subscriptions/" + enc(arg) + "/reset", body);
      if (done) show("subscription " + arg + " reset to " + what, false);
    } else if (action === "delete-sub") {
      if (!window.confirm("Delete subscription " + arg + "? Its consume position is lost.")) return;
      done = await change("DELETE", topicPath() + "/subscriptions/" + enc(arg));
      if (done) show("subscription " + arg + " deleted", false);
    } else if (action === "compact") {
      // the admin API answers once the run is done (hub.admin_compaction); the status below follows by polling
      button.disabled = true;
      try { done = await change("POST", topicPath() + "/compact"); } finally { button.disabled = false; }
      if (done) {
        show("topic compacted up to seq id " + done.compacted_up_to_seq_id + " into ledger "
             + format(done.ledger_id, "int") + " (" + done.messages + " keys kept)", false);
      }
    } else if (action === "release") {
      done = await change("POST", topicPath() + "/release");
      if (done) show("topic released by " + done.owner + " at seq id " + done.last_seq_id, false);
    } else if (action === "delete-topic") {
      const name = document.querySelector("[data-topic]").dataset.topic;
      if (!window.confirm("Delete topic " + name + " with its messages and subscriptions?")) return;
      done = await change("DELETE", topicPath());
      if (done) show("topic " + name + " deleted", false);
    } else if (action === "readonly") {
      const readOnly = button.dataset.value !== "read_only";
      done = await change("PUT", "/admin/v1/bookies/" + enc(arg) + "/readonly", {readOnly});
      if (done) show("bookie " + arg + (readOnly ? " is read-only" : " is writable again"), false);
    } else if (action === "audit") {
      done = await change("POST", "/admin/v1/autorecovery/audit");
      if (done) show("audit requested", false);
    } else if (action === "revoke") {
      const prefix = button.dataset.arg2 || "";
      if (!window.confirm("Revoke every action of " + arg + " on '" + prefix + "'?")) return;
      done = await change("DELETE", "/admin/v1/permissions/" + enc(arg) + "/" + enc(prefix));
      if (done) show("revoked " + arg + " on '" + prefix + "'", false);
    } else if (action === "delete-policy") {
      if (!window.confirm("Delete the policy of prefix '" + arg + "'? The hub conf's defaults apply again.")) return;
      done = await change("DELETE", "/admin/v1/policies/" + enc(arg));
      if (done) { sessionStorage.setItem("quire-message", "policy of '" + arg + "' deleted"); location.reload(); }
    }
    if (done) document.querySelectorAll("[data-poll]").forEach(poll);
  }

  document.addEventListener("click", (event) => {
    const button = event.target.closest("button[data-action]");
    if (button) { event.preventDefault(); act(button); }
  });

  const grantForm = document.getElementById("grant-form");
  if (grantForm) {
    grantForm.addEventListener("submit", async (event) => {
      event.preventDefault();
      const f = grantForm.elements;
      const actions = ["produce", "consume"].filter((a) => f[a].checked);
      const role = f.role.value.trim(), prefix = f.prefix.value;
      const done = await change("PUT", "/admin/v1/permissions/" + enc(role) + "/" + enc(prefix), {actions});
      if (done) {
        show("granted " + actions.join(", ") + " on '" + prefix + "' to " + role, false);
        document.querySelectorAll("[data-poll]").forEach(poll);
      }
    });
  }

  const policyForm = document.getElementById("policy-form");
  if (policyForm) {
    policyForm.addEventListener("submit", async (event) => {
      event.preventDefault();
      const f = policyForm.elements, prefix = f.prefix.value, body = {};
      for (const pair of f.settings.value.trim().split(/\s+/)) {
        const at = pair.indexOf("=");
        if (at < 1) { show("expected key=value, not '" + pair + "'", true); return; }
        const raw = pair.slice(at + 1), num = Number(raw);
        body[pair.slice(0, at)] = raw !== "" && !Number.isNaN(num) ? num : raw;
      }
      const done = await change("PUT", "/admin/v1/policies/" + enc(prefix), body);
      if (done) { sessionStorage.setItem("quire-message", "policy of '" + prefix + "' set"); location.reload(); }
    });
  }

  const carried = sessionStorage.getItem("quire-message");     // said before a reload
  if (carried) { sessionStorage.removeItem("quire-message"); show(carried, false); }
  tokenState();
  const sections = document.querySelectorAll("[data-poll]");
  sections.forEach((s) => { poll(s); setInterval(() => poll(s), POLL_MS); });
  window.quireConsole = {format, page: PAGE};
})();
