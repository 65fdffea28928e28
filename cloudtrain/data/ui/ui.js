// cloudtrain ui: the jobs view, a job's page, compare and cost, drawn from the JSON API of
// cloudtrain/dashboard.py. Everything a job wrote is put in the page as text (textContent),
// never as markup. Views poll while they are shown: nothing reloads.
"use strict";

const TOKEN = new URLSearchParams(location.search).get("token") || "";
const POLL_MS = 2000;
let timer = null;       // the shown view's poll
let generation = 0;     // a view's polls stop once another view is shown

async function api(path, options = {}) {
  const response = await fetch(path, {
    ...options, headers: {"X-Cloudtrain-Token": TOKEN, "Content-Type": "application/json",
                          ...(options.headers || {})}});
  const data = await response.json().catch(() => ({error: response.statusText}));
  if (!response.ok) throw new Error(data.error || response.statusText);
  return data;
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (v !== null && v !== undefined) node.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

const money = v => (typeof v === "number" ? "$" + v.toFixed(4) : "");
const num = (v, d = 4) => (typeof v === "number" ? (Math.abs(v) >= 100 ? v.toFixed(1) : v.toPrecision(d)) : "");
function span(s) {
  if (typeof s !== "number") return "";
  const h = Math.floor(s / 3600), m = Math.floor(s % 3600 / 60), x = Math.floor(s % 60);
  return h ? `${h}h${String(m).padStart(2, "0")}m` : m ? `${m}m${String(x).padStart(2, "0")}s` : `${x}s`;
}
const when = t => (typeof t === "number" ? new Date(t * 1000).toLocaleString() :
                   typeof t === "string" ? new Date(t).toLocaleString() : "");
function say(text) { document.getElementById("status").textContent = text; }

function poll(fn) {
  const mine = generation;
  const tick = async () => {
    if (mine !== generation) return;
    try { await fn(); say(""); } catch (e) { say(e.message); }
    if (mine === generation) timer = setTimeout(tick, POLL_MS);
  };
  tick();
}

// -- the jobs view ---------------------------------------------------------------------------

const filters = {state: "", recipe: "", name: "", since: ""};

function jobsView(view) {
  const picked = new Set();
  let loaded = 100;
  const body = el("tbody");
  const count = el("span", {class: "muted"});
  const compare = el("button", {disabled: "", onclick: () => {
    location.hash = "#/compare/" + [...picked].join(",");
  }}, "compare");
  const inputs = Object.keys(filters).map(k => el("input", {
    placeholder: k === "since" ? "since (2h, 3d)" : k, value: filters[k], "data-filter": k,
    onchange: e => { filters[k] = e.target.value.trim(); loaded = 100; refresh(); }}));
  const more = el("button", {onclick: () => { loaded += 100; refresh(); }}, "more");
  view.append(el("div", {class: "bar"}, inputs, compare, count),
              el("table", {class: "jobs"}, el("thead", {}, el("tr", {},
                ["", "id", "name", "state", "what", "backend", "instance", "elapsed", "epoch",
                 "loss", "acc", "cost", "expected", "attempts", "created"].map(h => el("th", {}, h)))),
                 body), more);
  new IntersectionObserver(es => { if (es[0].isIntersecting && body.rows.length >= loaded) {
    loaded += 100; refresh(); } }).observe(more);

  async function refresh() {
    const q = new URLSearchParams({...filters, offset: 0, limit: Math.min(loaded, 1000)});
    const data = await api("/api/jobs?" + q);
    count.textContent = `${data.total} job${data.total === 1 ? "" : "s"}`;
    more.hidden = data.jobs.length >= data.total;
    body.replaceChildren(...data.jobs.map(j => {
      const box = el("input", {type: "checkbox", onclick: e => {
        e.stopPropagation();
        e.target.checked ? picked.add(j.id) : picked.delete(j.id);
        compare.disabled = picked.size < 2;
      }});
      box.checked = picked.has(j.id);
      return el("tr", {class: "state-" + j.state, "data-job": j.id,
                       onclick: () => { location.hash = "#/job/" + j.id; }},
        el("td", {}, box), el("td", {class: "mono"}, j.id), el("td", {}, j.name || ""),
        el("td", {class: "state"}, j.state + (j.reason ? ": " + j.reason : "")),
        el("td", {class: "what"}, j.what), el("td", {}, j.backend),
        el("td", {}, j.instance ? `${j.instance} ${j.market}` + (j.nodes > 1 ? ` x${j.nodes}` : "") : ""),
        el("td", {}, span(j.runtime_s)),
        el("td", {}, j.epoch == null ? "" : j.epoch + (j.epochs ? "/" + j.epochs : "")),
        el("td", {}, num(j.loss)), el("td", {}, num(j.accuracy)),
        el("td", {}, money(j.cost) + (j.cost != null && !j.settled ? " ~" : "")
                     + (j.budget_usd != null ? ` of $${j.budget_usd.toFixed(2)}` : "")),
        el("td", {}, money(j.expected_usd)),
        el("td", {}, j.attempts ? `${j.attempts}` + (j.recoveries ? ` (${j.recoveries} recovered)` : "") : ""),
        el("td", {}, when(j.created_at)));
    }));
  }
  poll(refresh);
  // once the rows are up, fetch plotly.js into the browser's cache for the first job's page
  setTimeout(() => { if (!window.Plotly && !document.querySelector("link[rel=prefetch]"))
    document.head.append(el("link", {rel: "prefetch", href: "/static/plotly.min.js"})); }, 300);
}

// -- charts ----------------------------------------------------------------------------------

// plotly.js (4.8 MB from the plotly package) is loaded by the first view that draws, so the
// jobs view does not wait for it.
let loading = null;
function plotly() {
  if (window.Plotly) return Promise.resolve();
  loading = loading || new Promise((done, failed) => {
    const script = el("script", {src: "/static/plotly.min.js"});
    script.onload = done;
    script.onerror = () => { loading = null; failed(new Error("plotly.js did not load")); };
    document.head.append(script);
  });
  return loading;
}

const LAYOUT = {margin: {l: 50, r: 10, t: 30, b: 40}, height: 260, legend: {orientation: "h"},
                paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)"};
const CONFIG = {displaylogo: false, responsive: true};

function keysOf(rows, test) {
  const keys = new Set();
  for (const r of rows) for (const [k, v] of Object.entries(r))
    if (typeof v === "number" && test(k)) keys.add(k);
  return [...keys];
}
const isLoss = k => /loss/i.test(k);
const isAcc = k => /acc|top1|top5/i.test(k);
const isLr = k => /^lr$|learning_rate|(^|_)lr(_|$)/i.test(k);
const isRate = k => /per_s(ec)?$|throughput/i.test(k);

function xOf(rows, axis, started) {
  const timed = rows.some(r => typeof r.time === "number" || typeof r.elapsed === "number");
  if (axis === "step" || !timed) return rows.map((r, i) => r.step ?? r.epoch ?? i);
  return rows.map(r => (typeof r.time === "number" && started ? r.time - started :
                        r.elapsed ?? r.time ?? null));
}

function drawMetric(node, title, jobs, test, axis, target) {
  const traces = [];
  for (const j of jobs) {
    const rows = j.rows || [];
    const started = typeof j.started_at === "number" ? j.started_at : null;
    for (const k of keysOf(rows, test)) {
      const kept = rows.filter(r => typeof r[k] === "number");
      traces.push({x: xOf(kept, axis, started), y: kept.map(r => r[k]), mode: "lines+markers",
                   name: (jobs.length > 1 ? (j.name || j.id) + " " : "") + k});
    }
  }
  if (!traces.length) { node.replaceChildren(el("p", {class: "muted"}, `no ${title} in its metrics (yet)`)); return; }
  const shapes = typeof target === "number" ? [{type: "line", xref: "paper", x0: 0, x1: 1,
    y0: target, y1: target, line: {dash: "dash", color: "#c33"}}] : [];
  const timed = jobs.some(j => (j.rows || []).some(r => typeof r.time === "number" ||
                                                       typeof r.elapsed === "number"));
  const layout = {...LAYOUT, title: {text: title}, shapes, xaxis: {title: {
    text: axis === "time" && timed ? "seconds since the start" : "step (epoch)"}}};
  if (!node.dataset.drawn) { node.replaceChildren(); node.dataset.drawn = "1"; }
  Plotly.react(node, traces, layout, CONFIG);
}

async function charts(holder, jobs, axis, target) {
  await plotly();
  const boxes = ["loss", "accuracy", "learning rate", "throughput"].map(t =>
    el("div", {class: "chart", "data-chart": t}));
  holder.replaceChildren(...boxes);
  const tests = [isLoss, isAcc, isLr, isRate];
  boxes.forEach((b, i) => drawMetric(b, b.dataset.chart, jobs, tests[i], axis,
                                     i === 1 ? target : null));
}

function axisPicker(onchange) {
  const pick = el("select", {onchange: e => onchange(e.target.value)},
                  el("option", {value: "time"}, "against time"),
                  el("option", {value: "step"}, "against steps"));
  return pick;
}

// -- a job's page ----------------------------------------------------------------------------

function jobView(view, id) {
  let axis = "time", logOffset = null;
  const head = el("h2"), facts = el("div", {class: "facts"}), actions = el("div", {class: "bar"});
  const holder = el("div", {class: "charts"}), timeline = el("tbody"), attempts = el("tbody");
  const items = el("tbody"), plan = el("tbody"), cmds = el("div", {class: "cmds"});
  const log = el("pre", {class: "log"});
  view.append(head, facts, actions,
    el("h3", {}, "curves ", axisPicker(v => { axis = v; holder.replaceChildren(); drawn = ""; })),
    holder,
    el("div", {class: "cols"},
      el("section", {}, el("h3", {}, "timeline"), el("table", {}, timeline)),
      el("section", {}, el("h3", {}, "plan"), el("table", {}, plan), el("h3", {}, "commands"), cmds)),
    el("h3", {}, "cost by attempt"), el("table", {}, el("thead", {}, el("tr", {},
      ["attempt", "market", "instance", "where", "ran", "outcome", "cost"].map(h => el("th", {}, h)))),
      attempts),
    el("h3", {}, "cost by item"), el("table", {}, items),
    el("h3", {}, "log"), log);
  let drawn = "";

  async function refresh() {
    const job = await api("/api/jobs/" + encodeURIComponent(id));
    head.textContent = `${job.id}${job.name ? " " + job.name : ""}: ${job.state}` +
      (job.reason ? ` (${job.reason})` : "");
    facts.replaceChildren(el("span", {}, job.command), el("span", {class: "muted"},
      ` cost ${money(job.cost)}${job.cost_settled ? "" : " ~"}`));
    const active = !["succeeded", "failed", "cancelled", "stopped", "lost"].includes(job.state) &&
                   !job.ended_at;
    actions.replaceChildren(...(active ? [el("button", {class: "danger", onclick: async () => {
      if (!confirm(`Stop job ${job.id} and terminate its instances?`)) return;
      const out = await api(`/api/jobs/${encodeURIComponent(job.id)}/stop`,
                            {method: "POST", body: JSON.stringify({confirm: true})});
      say(out.said);
    }}, "stop")] : []));
    timeline.replaceChildren(...(job.timeline || []).map(p => el("tr",
      {class: /interrupt|recover|lost|notice/i.test(p.name + " " + (p.detail || "")) ? "mark" : ""},
      el("td", {}, when(p.start)), el("td", {}, p.name), el("td", {class: "detail"}, p.detail || ""))));
    plan.replaceChildren(...(job.plan || []).map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", {}, v))));
    cmds.replaceChildren(...Object.entries(job.commands || {}).map(([k, v]) =>
      el("div", {}, el("span", {class: "muted"}, k + " "), el("code", {}, v))));
    attempts.replaceChildren(...(job.attempts || []).map(a => el("tr", {class: a.outcome === "interrupted" ? "mark" : ""},
      el("td", {}, a.attempt ?? ""), el("td", {}, a.market || ""), el("td", {}, a.type || ""),
      el("td", {}, [a.region, a.zone].filter(Boolean).join(" ")),
      el("td", {}, a.started_at && a.ended_at ? span((new Date(a.ended_at) - new Date(a.started_at)) / 1000) : ""),
      el("td", {}, (a.outcome || "") + (a.reason ? ": " + a.reason : "")), el("td", {}, money(a.usd)))));
    const phases = (job.cost_items && job.cost_items.phases) || {};
    items.replaceChildren(...Object.entries(phases).map(([k, v]) =>
      el("tr", {}, el("th", {}, k), el("td", {}, money(typeof v === "number" ? v : v && v.dollars)))));
    const m = await api("/api/metrics?jobs=" + encodeURIComponent(job.id));
    const key = JSON.stringify([axis, m.jobs.map(j => (j.rows || []).length)]);
    if (key !== drawn) { drawn = key; await charts(holder, m.jobs, axis, m.jobs[0] && m.jobs[0].target); }
    const got = await api(`/api/jobs/${encodeURIComponent(job.id)}/log?offset=${logOffset ?? 0}`);
    if (logOffset === null || got.start !== logOffset) log.textContent = "";
    log.textContent += got.text;
    if (log.textContent.length > 200000) log.textContent = log.textContent.slice(-150000);
    logOffset = got.offset;
    if (active) log.scrollTop = log.scrollHeight;
  }
  poll(refresh);
}

// -- compare ---------------------------------------------------------------------------------

function compareView(view, ids) {
  let axis = "time";
  const holder = el("div", {class: "charts"}), side = el("tbody");
  view.append(el("h2", {}, "compare ", axisPicker(v => { axis = v; refresh(); })), holder,
              el("h3", {}, "cost to the target"), el("table", {}, el("thead", {}, el("tr", {},
                ["job", "state", "cost", "to the target"].map(h => el("th", {}, h)))), side));
  async function refresh() {
    const m = await api("/api/metrics?jobs=" + encodeURIComponent(ids.join(",")));
    await charts(holder, m.jobs, axis, m.jobs.find(j => typeof j.target === "number")?.target);
    side.replaceChildren(...m.jobs.map(j => el("tr", {},
      el("td", {}, (j.name ? j.name + " " : "") + j.id), el("td", {}, j.state || ""),
      el("td", {}, money(j.cost)), el("td", {}, j.to_target == null ? "not reached" : money(j.to_target)))));
  }
  refresh().catch(e => say(e.message));
}

// -- cost ------------------------------------------------------------------------------------

function costView(view) {
  const boxes = ["day", "recipe", "instance"].map(by => el("div", {class: "chart", "data-by": by}));
  const since = el("input", {placeholder: "since (30d)", onchange: () => refresh()});
  const saved = el("div", {class: "chart", "data-by": "spot"});
  view.append(el("div", {class: "bar"}, since), el("div", {class: "charts"}, boxes, saved));
  async function refresh() {
    await plotly();
    for (const box of boxes) {
      const by = box.dataset.by;
      const q = new URLSearchParams({by});
      if (since.value.trim()) q.set("since", since.value.trim());
      const r = await api("/api/cost?" + q);
      const rows = r.rows || [];
      Plotly.react(box, [{type: "bar", x: rows.map(x => String(x[by] ?? "")),
                          y: rows.map(x => x.dollars ?? 0), name: "USD"}],
                   {...LAYOUT, title: {text: `by ${by}: total ${money((r.total || {}).dollars)}`}},
                   CONFIG);
      if (by === "day" && r.spot) {
        const s = r.spot;
        Plotly.react(saved, [{type: "bar", x: ["spot, as billed", "the same hours on-demand"],
                              y: [s.spot_usd, s.on_demand_usd]}],
                     {...LAYOUT, title: {text: `spot saved ${money(s.saved_usd)} over ${s.instances} instance${s.instances === 1 ? "" : "s"}`
                                               + (s.unpriced ? ` (${s.unpriced} not priced)` : "")}}, CONFIG);
      }
    }
  }
  refresh().catch(e => say(e.message));
}

// -- routing ---------------------------------------------------------------------------------

function route() {
  generation += 1;
  clearTimeout(timer);
  const view = document.getElementById("view");
  view.replaceChildren();
  const [, page, arg] = location.hash.split("/");
  if (page === "job" && arg) jobView(view, decodeURIComponent(arg));
  else if (page === "compare" && arg) compareView(view, decodeURIComponent(arg).split(","));
  else if (page === "cost") costView(view);
  else jobsView(view);
}

window.addEventListener("hashchange", route);
route();
