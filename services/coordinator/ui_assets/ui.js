// The Libra live view (served by the coordinator; no build step, no dependencies).
// The job page polls /ui/api/jobs/{id}/view (the run view, libra/run_view.py) and
// redraws every panel; the jobs page polls /ui/api/jobs. The token travels in the
// HttpOnly cookie the coordinator set (docs/observability.md), never in this script.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const params = new URLSearchParams(location.search);
const intervalMs = Math.max(250, Number(params.get("interval_ms")) || 1000);

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  return node;
}

function row(cells) {
  const tr = el("tr");
  for (const c of cells) tr.appendChild(el("td", c));
  return tr;
}

function fill(tbody, rows) {
  tbody.replaceChildren(...rows.map(row));
}

function fmt(x, digits) {
  return x === null || x === undefined ? "-" : Number(x).toFixed(digits);
}

function notice(text) {
  const box = document.getElementById("notice");
  box.textContent = text || "";
  box.hidden = !text;
}

// A fetch that turns the API's ErrorBody into a message for the notice line.
async function getJson(url) {
  const resp = await fetch(url, {credentials: "same-origin", cache: "no-store"});
  if (!resp.ok) {
    let message = resp.status + " " + resp.statusText;
    try { message = (await resp.json()).message || message; } catch (e) { /* not JSON */ }
    const err = new Error(message);
    err.status = resp.status;
    throw err;
  }
  return resp.json();
}

function bar(name, share, value) {
  const line = el("div", null, "bar");
  const track = el("div", null, "track");
  const fillDiv = el("div", null, "fill");
  fillDiv.style.width = Math.max(0, Math.min(100, share * 100)).toFixed(1) + "%";
  track.appendChild(fillDiv);
  line.append(el("span", name, "name"), track, el("span", value, "value"));
  return line;
}

// The reward curve: reward per step (line), eval rounds (dots); y in [0, 1] unless the
// rewards leave it, x over the steps seen (or the job's target when known).
function drawCurve(view) {
  const box = document.getElementById("curve");
  // One user unit per CSS pixel: the chart fills its panel without stretching text.
  const W = Math.max(320, Math.round(box.getBoundingClientRect().width) || 640);
  const H = 220, L = 36, R = 10, T = 10, B = 24;
  box.setAttribute("viewBox", "0 0 " + W + " " + H);
  const pts = view.curve, evals = view.evals;
  const ys = pts.map(p => p.reward_mean).concat(evals.map(e => e.reward_mean));
  const yMin = Math.min(0, ...ys), yMax = Math.max(1, ...ys);
  const xMax = Math.max(1, view.job.target_steps, ...pts.map(p => p.step),
                        ...evals.map(e => e.step));
  const x = s => L + (W - L - R) * s / xMax;
  const y = v => T + (H - T - B) * (1 - (v - yMin) / ((yMax - yMin) || 1));
  const kids = [svg("line", {x1: L, y1: H - B, x2: W - R, y2: H - B, class: "axis"}),
                svg("line", {x1: L, y1: T, x2: L, y2: H - B, class: "axis"})];
  for (const v of [yMin, (yMin + yMax) / 2, yMax]) {
    const t = svg("text", {x: 2, y: y(v) + 3, class: "tick"});
    t.textContent = v.toFixed(2);
    kids.push(t);
  }
  const xt = svg("text", {x: W - R - 60, y: H - 6, class: "tick"});
  xt.textContent = "step " + xMax;
  kids.push(xt);
  if (pts.length) {
    const d = pts.map((p, i) => (i ? "L" : "M") + x(p.step).toFixed(1) + " "
                               + y(p.reward_mean).toFixed(1)).join(" ");
    kids.push(svg("path", {d: d, class: "reward"}));
  }
  for (const e of evals) kids.push(svg("circle", {cx: x(e.step), cy: y(e.reward_mean), r: 4,
                                                   class: "evalpt"}));
  box.replaceChildren(...kids);
  box.dataset.points = String(pts.length);
  const last = view.reward_last === null ? "-" : fmt(view.reward_last, 3);
  const ev = evals.length ? "; eval reward " + fmt(evals[evals.length - 1].reward_mean, 3)
    + ", accuracy " + fmt(evals[evals.length - 1].accuracy, 3) + " (green)" : "";
  document.getElementById("reward-line").textContent =
    pts.length + " steps; last reward " + last + " (blue)" + ev;
}

function drawJob(view) {
  const job = view.job;
  document.title = "Libra: " + job.name + " (" + job.job_id + ")";
  document.getElementById("title").textContent = job.name + " " + job.job_id;
  const state = document.getElementById("state");
  state.textContent = job.state;
  state.className = "badge " + job.state;
  document.getElementById("progress").textContent = "step " + job.step
    + (job.target_steps ? " / " + job.target_steps : "") + ", policy v" + job.policy_version;
  document.getElementById("verdict").textContent = view.verdict.line;
  drawCurve(view);
  document.getElementById("phases").replaceChildren(...view.phases.map(
    p => bar(p.phase, p.share, fmt(p.mean_s, 3) + " s " + (p.share * 100).toFixed(0) + "%")));
  const tp = view.throughput;
  document.getElementById("throughput").textContent = "step " + fmt(tp.step_wall_s, 2)
    + " s; " + fmt(tp.trajectories_per_s, 2) + " trajectories/s; "
    + fmt(tp.tokens_per_s, 0) + " tokens/s";
  const c = view.counters;
  fill(document.querySelector("#counters tbody"), [
    ["produced", c.produced], ["trained", c.trained], ["dropped stale", c.dropped_stale],
    ["dropped failed", c.dropped_failed], ["requeued", c.requeued], ["in flight", c.in_flight]]);
  document.getElementById("buckets").replaceChildren(...view.buckets.map(
    b => bar(b.bucket, b.share, b.placed_total + " (last " + b.placed_last_step + ")")));
  document.getElementById("migrations").textContent = "migrations: "
    + view.migrations_total + " total, " + view.migrations_last_step + " last step";
  fill(document.querySelector("#workers tbody"),
       view.workers.map(w => [w.worker_id, w.role, w.bucket, w.epoch]));
  document.getElementById("hybrid").textContent = "hybrid workers training: "
    + view.hybrid_training + ", joining: " + view.hybrid_joining;
  document.getElementById("events").replaceChildren(...view.events.slice().reverse().map(
    e => el("li", new Date(e.ts_ms).toLocaleTimeString() + (e.step ? " step " + e.step : "")
            + " " + e.kind + (e.count > 1 ? " (x" + e.count + ")" : "")
            + (e.worker_id ? " " + e.worker_id : "") + (e.detail ? " " + e.detail : ""))));
  if (!view.events.length) document.getElementById("events").appendChild(el("li", "none yet"));
  fill(document.querySelector("#queue tbody"), view.queue.map(
    q => [q.job_id, q.state, q.step, q.queue_position || "-"]));
}

function jobIdFromPath() {
  const parts = location.pathname.split("/");
  return decodeURIComponent(parts[parts.length - 1]);
}

async function pollJob() {
  const jobId = jobIdFromPath();
  try {
    const view = await getJson("/ui/api/jobs/" + encodeURIComponent(jobId) + "/view");
    drawJob(view);
    notice("");
    document.getElementById("updated").textContent = "updated "
      + new Date().toLocaleTimeString() + " (every " + intervalMs + " ms)";
  } catch (err) {
    notice(err.status === 404 ? "No job '" + jobId + "' on this coordinator."
      : "Cannot read the view: " + err.message);
  }
  setTimeout(pollJob, intervalMs);
}

async function pollJobs() {
  try {
    const jobs = await getJson("/ui/api/jobs");
    const rows = jobs.slice().reverse().map(j => {
      const tr = el("tr");
      const link = el("a", j.job_id);
      link.href = "/ui/jobs/" + encodeURIComponent(j.job_id);
      const first = el("td");
      first.appendChild(link);
      tr.appendChild(first);
      for (const v of [j.name, j.state, j.step + (j.target_steps ? "/" + j.target_steps : ""),
                       j.policy_version, j.queue_position || "-", j.message]) {
        tr.appendChild(el("td", v));
      }
      return tr;
    });
    document.querySelector("#jobs tbody").replaceChildren(...rows);
    notice(jobs.length ? "" : "No jobs yet: libra submit JOB.toml");
    document.getElementById("updated").textContent = "updated "
      + new Date().toLocaleTimeString();
  } catch (err) {
    notice("Cannot list jobs: " + err.message);
  }
  setTimeout(pollJobs, Math.max(intervalMs, 2000));
}

if (document.body.dataset.page === "job") pollJob(); else pollJobs();
