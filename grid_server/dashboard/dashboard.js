// Grid dashboard: polls GET /allocator/status?detail=1 and GET /dashboard/history and redraws.
// Every value from the server is inserted as text (never as HTML). No libraries, no CDN.
"use strict";

const POLL_MS = 1500; // live enough to watch a cold model load; cheap for the server
const CHART_W = 320;
const CHART_H = 120;
const SERIES = [
  ["request_rate_rps", "demand req/s", "#1f6feb"],
  ["offered_concurrency", "offered concurrency", "#8250df"],
  ["desired", "desired replicas", "#bf8700"],
  ["ready", "ready replicas", "#1a7f37"],
];
const SVG_NS = "http://www.w3.org/2000/svg";

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else node.setAttribute(k, v);
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : String(c));
  }
  return node;
}

function table(headers, rows, id) {
  const t = el("table", id ? { id } : {});
  t.append(el("tr", {}, ...headers.map((h) => el("th", {}, h))));
  for (const r of rows) t.append(r instanceof Node ? r : el("tr", {}, ...r.map((c) => el("td", {}, c))));
  return t;
}

function ago(t) {
  if (!t) return "-";
  const s = Math.max(0, Date.now() / 1000 - t);
  return s < 90 ? `${s.toFixed(0)} s ago` : `${(s / 60).toFixed(1)} min ago`;
}

function replace(id, node) {
  const box = document.getElementById(id);
  box.replaceChildren(node);
}

// --- fleet grid -----------------------------------------------------------------------------
function fleetGrid(ctl) {
  const hosts = ctl.hosts || [];
  const models = new Set((ctl.profiles || []).map((p) => p.model_id));
  for (const h of hosts) for (const r of h.residencies || []) models.add(r.model_id);
  const modelList = [...models].sort();
  const planned = new Set();
  for (const a of (ctl.plan && ctl.plan.assignments) || []) planned.add(`${a.host_id}\u0000${a.model_id}`);
  const rows = hosts.map((h) => {
    const res = new Map((h.residencies || []).map((r) => [r.model_id, r]));
    const head = el(
      "td",
      { id: `host-${h.host_id}`, "data-host": h.host_id, "data-state": h.state },
      el("strong", {}, h.host_id),
      " ",
      el("span", { class: `badge hs-${h.state}` }, h.state),
      el("div", { class: "muted" },
        `${h.used_mb} / ${h.allocatable_mb} MB used · heartbeat ${h.heartbeat_age_s == null ? "-" : h.heartbeat_age_s.toFixed(0) + " s"}`),
    );
    const cells = modelList.map((m) => {
      const r = res.get(m);
      const state = r ? r.state : "absent";
      const wanted = planned.has(`${h.host_id}\u0000${m}`);
      const live = r && ["loading", "warming", "ready"].includes(r.state);
      let arrow = null;
      if (wanted && !live) arrow = el("span", { class: "plan-load", title: "the plan loads it here" }, " → load");
      if (!wanted && live) arrow = el("span", { class: "plan-unload", title: "the plan removes it here" }, " → unload");
      return el(
        "td",
        { id: `cell-${h.host_id}-${m}`, "data-host": h.host_id, "data-model": m, "data-state": state },
        el("span", { class: `badge st-${state}` }, r ? r.state : "·"),
        arrow,
      );
    });
    return el("tr", {}, head, ...cells);
  });
  return table(["host", ...modelList], rows, "fleet-table");
}

// --- plan vs fleet --------------------------------------------------------------------------
function planView(ctl) {
  const box = el("div", {});
  const rec = ctl.reconciliation || {};
  const forecasts = ctl.forecasts || {};
  const desired = (ctl.plan && ctl.plan.desired) || {};
  const ready = rec.ready || {};
  const where = {};
  for (const a of (ctl.plan && ctl.plan.assignments) || []) (where[a.model_id] ||= []).push(a.host_id);
  const unmet = {};
  for (const u of ctl.unmet || []) (unmet[u.model_id] ||= []).push(u.code);
  const modelRows = Object.keys(desired).sort().map((m) => {
    const f = forecasts[m] || {};
    return [m, desired[m], ready[m] || 0, (where[m] || []).join(", ") || "-",
      (f.request_rate_rps || 0).toFixed(3), (f.reasons || []).join(", ") || "-",
      (unmet[m] || []).join(", ") || "-"];
  });
  box.append(el("h3", {}, "Models"), table(["model", "desired", "ready", "planned on", "demand req/s",
    "why this count", "unmet"], modelRows, "plan-models"));
  const proposals = (rec.proposals || []).map((p) => [p.kind, p.host_id, p.model_id, p.reason,
    p.eviction ? `eviction for ${p.beneficiary || "-"}` : p.service_class]);
  box.append(el("h3", {}, `Will do (${rec.mode || ctl.mode} mode${rec.hold ? `, hold: ${rec.hold}` : ""})`),
    proposals.length ? table(["kind", "host", "model", "reason", "class"], proposals, "plan-proposals")
      : el("p", { class: "muted" }, "nothing: the fleet matches the plan"));
  const pending = (ctl.pending_commands || []).map((a) => [a.kind, a.host_id, a.model_id, a.status, a.reason]);
  if (pending.length) box.append(el("h3", {}, "In progress"), table(["kind", "host", "model", "status", "reason"], pending));
  const deferred = (rec.deferred || []).map((d) => [d.kind, d.host_id, d.model_id, d.reason]);
  if (deferred.length) box.append(el("h3", {}, "Deferred"), table(["kind", "host", "model", "why not now"], deferred));
  const evictions = ((ctl.plan && ctl.plan.evictions) || []).map((e) => [e.model_id, e.host_id, e.beneficiary || "-", e.reason]);
  if (evictions.length) box.append(el("h3", {}, "Staged evictions"), table(["model", "host", "for", "reason"], evictions));
  return box;
}

function unmetView(ctl) {
  const rows = (ctl.unmet || []).map((u) => [u.model_id, u.code, u.resource || "-", u.missing,
    u.host_id || "-", u.message]);
  if (!rows.length) return el("p", { class: "muted", id: "unmet-none" }, "every desired replica is placed");
  return table(["model", "reason", "binding", "missing", "host", "detail"], rows, "unmet-table");
}

// --- charts ---------------------------------------------------------------------------------
function chart(model, points) {
  const svg = document.createElementNS(SVG_NS, "svg");
  svg.setAttribute("width", CHART_W);
  svg.setAttribute("height", CHART_H);
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", `${model} over time`);
  const pts = points.filter((p) => p.models[model]);
  if (pts.length) {
    const t0 = pts[0].t;
    const t1 = Math.max(pts[pts.length - 1].t, t0 + 1);
    let ymax = 1;
    for (const p of pts) for (const v of p.models[model]) ymax = Math.max(ymax, v);
    const x = (t) => 4 + ((t - t0) / (t1 - t0)) * (CHART_W - 8);
    const y = (v) => CHART_H - 14 - (v / ymax) * (CHART_H - 24);
    SERIES.forEach(([, , color], i) => {
      const line = document.createElementNS(SVG_NS, "polyline");
      line.setAttribute("fill", "none");
      line.setAttribute("stroke", color);
      line.setAttribute("stroke-width", "1.6");
      line.setAttribute("points", pts.map((p) => `${x(p.t).toFixed(1)},${y(p.models[model][i]).toFixed(1)}`).join(" "));
      svg.append(line);
    });
    const label = document.createElementNS(SVG_NS, "text");
    label.setAttribute("x", 4);
    label.setAttribute("y", 10);
    label.setAttribute("font-size", "10");
    label.textContent = `max ${ymax.toFixed(2)} · ${((t1 - t0) / 60).toFixed(1)} min`;
    svg.append(label);
  }
  return el("div", { class: "chart", "data-model": model }, el("h3", {}, model), svg);
}

function chartsView(history) {
  const points = history.points || [];
  const models = new Set();
  for (const p of points) for (const m of Object.keys(p.models)) models.add(m);
  const box = el("div", { class: "charts" });
  for (const m of [...models].sort()) box.append(chart(m, points));
  const legend = el("div", { class: "legend" },
    ...SERIES.map(([, name, color]) => el("span", {}, el("span", { style: `color:${color}` }, "■ "), name)));
  return el("div", {}, legend, box);
}

// --- actions --------------------------------------------------------------------------------
function actionsView(ctl) {
  const rows = (ctl.history || []).map((a) => [ago(a.completed_at), a.kind, a.host_id, a.model_id,
    el("span", { class: a.status === "succeeded" ? "badge st-ready" : "badge st-failed" }, a.status),
    a.reason, a.message || ""]);
  if (!rows.length) return el("p", { class: "muted" }, "no finished actions yet");
  return table(["when", "kind", "host", "model", "outcome", "reason", "message"], rows, "actions-table");
}

// --- summary and controls -------------------------------------------------------------------
function summary(doc) {
  const ctl = doc.controller || {};
  const srv = doc.server || {};
  return el("div", { class: "summary" },
    el("span", { id: "mode", "data-mode": doc.mode }, `mode: ${doc.mode}`),
    el("span", { id: "authority" }, `authority: ${ctl.authority || "-"}`),
    el("span", {}, `term ${ctl.controller_term ?? "-"}`),
    el("span", {}, `plan #${Number((ctl.generation || "").split(":")[1] || 0)}`),
    el("span", {}, `passes ${srv.ticks ?? "-"}`),
    ctl.automatic_refusal ? el("span", { class: "error" }, `automatic refused: ${ctl.automatic_refusal}`) : null,
    srv.last_error ? el("span", { class: "error" }, `last error: ${srv.last_error}`) : null,
    ctl.error ? el("span", { class: "error" }, `controller: ${ctl.error}`) : null);
}

async function setMode(mode, question) {
  const token = document.getElementById("token").value.trim();
  const out = document.getElementById("control-result");
  if (!token) return;
  if (!window.confirm(question)) { out.textContent = "cancelled"; return; }
  const resp = await fetch("/allocator/mode", {
    method: "PUT",
    headers: { "content-type": "application/json", "x-grid-allocator-token": token },
    body: JSON.stringify({ mode }),
  });
  const body = await resp.json().catch(() => ({}));
  out.textContent = resp.ok ? `mode is now ${body.mode}` : `refused: ${(body.error && body.error.message) || resp.status}`;
  out.className = resp.ok ? "muted" : "error";
  refresh();
}

function wireControls() {
  const token = document.getElementById("token");
  token.value = sessionStorage.getItem("grid-operator-token") || "";
  const sync = () => {
    sessionStorage.setItem("grid-operator-token", token.value);
    const off = !token.value.trim();
    document.getElementById("mode-apply").disabled = off;
    document.getElementById("kill-switch").disabled = off;
  };
  token.addEventListener("input", sync);
  sync();
  document.getElementById("mode-apply").addEventListener("click", () => {
    const mode = document.getElementById("mode-select").value;
    setMode(mode, `Switch the allocator to ${mode} mode?`);
  });
  document.getElementById("kill-switch").addEventListener("click", () =>
    setMode("recommend", "Kill switch: stop all automatic actions (mode recommend)?"));
}

// --- loop -----------------------------------------------------------------------------------
async function refresh() {
  try {
    const [status, history] = await Promise.all([
      fetch("/allocator/status?detail=1").then((r) => r.json()),
      fetch("/dashboard/history").then((r) => r.json()),
    ]);
    const ctl = status.controller || {};
    replace("summary", summary(status));
    replace("fleet", fleetGrid(ctl));
    replace("plan", planView(ctl));
    replace("unmet", unmetView(ctl));
    replace("charts", chartsView(history));
    replace("actions", actionsView(ctl));
    const sel = document.getElementById("mode-select");
    if (document.activeElement !== sel) sel.value = status.mode;
    document.getElementById("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
    document.body.dataset.ready = "1";
  } catch (err) {
    document.getElementById("updated").textContent = `server unreachable: ${err}`;
  }
}

wireControls();
refresh();
setInterval(refresh, POLL_MS);
