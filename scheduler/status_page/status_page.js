const colors = ["#0969da", "#cf222e", "#1a7f37", "#8250df", "#bc4c00", "#116329", "#a40e26", "#0550ae"];
const ns = "http://www.w3.org/2000/svg";
let lastGood = null, lastGoodAt = null;

function el(tag, attrs, parent) {
  const node = document.createElementNS(ns, tag);
  for (const key in attrs) node.setAttribute(key, attrs[key]);
  if (parent) parent.appendChild(node);
  return node;
}
function cell(text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  return td;
}
function duration(seconds) {
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return s + " s";
  if (s < 3600) return Math.floor(s / 60) + " min " + String(s % 60).padStart(2, "0") + " s";
  return Math.floor(s / 3600) + " h " + String(Math.floor(s % 3600 / 60)).padStart(2, "0") + " min";
}
// "Nice" tick values covering [lo, hi]: about `count` of them at 1, 2 or 5 x 10^k.
function ticks(lo, hi, count) {
  const raw = (hi - lo) / count, power = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map(m => m * power).find(s => s >= raw);
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(+v.toPrecision(12));
  return out;
}
// An exponential moving average with TensorBoard's debiasing: the first points are not
// pulled toward zero.
function smooth(values, weight) {
  let last = 0, n = 0;
  return values.map(v => { last = last * weight + (1 - weight) * v; n++; return last / (1 - Math.pow(weight, n)); });
}

// Draws the series (each {worker, points: [{step, value}]}) with axes and gridlines.
// yRange: fixed [lo, hi], or null to fit the data. faint: also draw raw values behind.
function drawChart(svg, series, yRange, yLabel, withRaw, totalSteps) {
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  const W = 560, H = 260, left = 52, right = 12, top = 10, bottom = 34;
  let maxStep = Math.max(1, totalSteps || 0), lo = Infinity, hi = -Infinity;
  for (const s of series) for (const p of s.points) {
    maxStep = Math.max(maxStep, p.step); lo = Math.min(lo, p.value); hi = Math.max(hi, p.value);
  }
  if (yRange) { lo = yRange[0]; hi = yRange[1]; }
  else if (!isFinite(lo)) { lo = 0; hi = 1; }
  else { const pad = (hi - lo) * 0.08 || Math.abs(hi) * 0.1 || 1; lo = Math.max(0, lo - pad); hi = hi + pad; }
  const x = step => left + (W - left - right) * step / maxStep;
  const y = v => top + (H - top - bottom) * (1 - (v - lo) / (hi - lo));
  const grid = el("g", {"class": "grid"}, svg);
  for (const v of ticks(lo, hi, 5)) {
    el("line", {x1: left, x2: W - right, y1: y(v), y2: y(v), stroke: "#eaeef2"}, grid);
    const t = el("text", {x: left - 6, y: y(v) + 4, "text-anchor": "end"}, grid);
    t.textContent = hi - lo < 0.05 ? v.toFixed(3) : hi - lo < 2 ? v.toFixed(2) : String(v);
  }
  for (const v of ticks(0, maxStep, 6)) {
    el("line", {x1: x(v), x2: x(v), y1: top, y2: H - bottom, stroke: "#eaeef2"}, grid);
    const t = el("text", {x: x(v), y: H - bottom + 14, "text-anchor": "middle"}, grid);
    t.textContent = v >= 10000 ? (v / 1000) + "k" : String(v);
  }
  el("line", {x1: left, x2: left, y1: top, y2: H - bottom, stroke: "#8c959f"}, svg);
  el("line", {x1: left, x2: W - right, y1: H - bottom, y2: H - bottom, stroke: "#8c959f"}, svg);
  const xl = el("text", {x: (left + W - right) / 2, y: H - 4, "text-anchor": "middle"}, svg);
  xl.textContent = "step";
  const yl = el("text", {x: 12, y: (top + H - bottom) / 2, "text-anchor": "middle",
                         transform: "rotate(-90 12 " + (top + H - bottom) / 2 + ")"}, svg);
  yl.textContent = yLabel;
  let total = 0;
  series.forEach((s, i) => {
    if (s.points.length === 0) return;
    const color = colors[i % colors.length];
    const line = values => s.points.map((p, k) => x(p.step).toFixed(1) + "," + y(values[k]).toFixed(1)).join(" ");
    const raw = s.points.map(p => p.value);
    if (withRaw) {
      el("polyline", {points: line(raw), fill: "none", stroke: color, "stroke-opacity": "0.22",
                      "stroke-width": "1", "class": "raw", "data-worker": s.worker}, svg);
    }
    const shown = withRaw ? smooth(raw, 0.85) : raw;
    el("polyline", {points: line(shown), fill: "none", stroke: color, "stroke-width": "2",
                    "class": withRaw ? "smoothed" : "values", "data-worker": s.worker}, svg);
    if (!withRaw) for (const p of s.points) el("circle", {cx: x(p.step), cy: y(p.value), r: 3, fill: color}, svg);
    total += s.points.length;
  });
  svg.setAttribute("data-points", String(total));
  return total;
}

function show(status, live) {
  const verdict = document.getElementById("verdict");
  verdict.textContent = status.verdict;
  verdict.className = status.has_result ? "finished" : status.verdict.startsWith("stalled") ? "stalled" : "";
  let summary = "map version " + status.map_version + " \u00b7 mode " + status.mode + " \u00b7 replication " + status.replication;
  if (status.slowest_worker) {
    summary += " \u00b7 slowest " + status.slowest_worker + " at step " + status.slowest_step + " (" +
               (status.fastest_step - status.slowest_step) + " behind)";
  }
  document.getElementById("summary").textContent = summary;
  const total = status.total_steps;
  const done = status.has_result ? total : status.slowest_step;
  document.getElementById("fig-steps").textContent = total > 0 ? done + " / " + total : (status.slowest_step || 0);
  document.getElementById("fig-steps-sub").textContent = total > 0 ? Math.floor(100 * done / total) + "% of the job's steps" : "total not known yet";
  document.getElementById("progress-bar").style.width = total > 0 ? (100 * done / total) + "%" : "0";
  const etaLabel = document.getElementById("fig-eta-label");
  if (status.has_result) {
    etaLabel.textContent = "took";
    document.getElementById("fig-eta").textContent = duration(status.elapsed_seconds);
    document.getElementById("fig-eta-sub").textContent = "finished";
  } else {
    etaLabel.textContent = "time left";
    document.getElementById("fig-eta").textContent = status.eta_seconds >= 0 ? duration(status.eta_seconds) : "-";
    document.getElementById("fig-eta-sub").textContent = "running for " + duration(status.elapsed_seconds);
  }
  const history = status.history || [];
  let lastLoss = null, lossWorker = "";
  for (const s of history) {
    if (s.points.length === 0) continue;
    const sm = smooth(s.points.map(p => p.loss), 0.85);
    if (lastLoss === null) { lastLoss = sm[sm.length - 1]; lossWorker = s.worker + " at step " + s.points[s.points.length - 1].step; }
  }
  document.getElementById("fig-loss").textContent = lastLoss === null ? "-" : lastLoss.toFixed(4);
  document.getElementById("fig-loss-sub").textContent = lossWorker;
  // A ctr model is scored by its AUC (and log loss), an mlp by its accuracy.
  const auc = status.test_metric === "AUC";
  const metric = "test " + (auc ? "AUC" : "accuracy");
  document.getElementById("fig-accuracy-label").textContent = metric;
  document.getElementById("accuracy-title").textContent = metric;
  let accuracy = null, accuracySub = "";
  if (status.has_result) {
    accuracy = status.test_accuracy;
    accuracySub = auc ? "final; log loss " + status.test_logloss.toFixed(4) : "final";
  } else for (const node of status.nodes) {
    if (node.progress.accuracy_step > 0) {
      accuracy = auc ? node.progress.test_auc : node.progress.test_accuracy;
      accuracySub = "at step " + node.progress.accuracy_step;
    }
  }
  document.getElementById("fig-accuracy").textContent = accuracy === null ? "-" : accuracy.toFixed(4);
  document.getElementById("fig-accuracy-sub").textContent = accuracy === null ? "after the first epoch" : accuracySub;
  document.getElementById("fig-rate").textContent = Math.round(status.samples_per_sec);
  document.getElementById("fig-rate-sub").textContent = status.has_result ? "over the whole job" : "all live workers";
  const alive = status.nodes.filter(n => n.health === "alive" || n.health === "finished").length;
  document.getElementById("fig-nodes").textContent = alive + " / " + status.nodes.length;
  const unwell = status.nodes.filter(n => n.health === "suspect" || n.health === "dead").map(n => n.name + " " + n.health);
  document.getElementById("fig-nodes-sub").textContent = unwell.length ? unwell.join(", ") : "all well";

  const body = document.querySelector("#nodes tbody");
  body.innerHTML = "";
  for (const node of status.nodes) {
    const worker = node.role === "worker";
    const row = document.createElement("tr");
    row.appendChild(cell(node.name));
    row.appendChild(cell(node.role));
    row.appendChild(cell(node.address));
    row.appendChild(cell(node.health, node.health));
    row.appendChild(cell(live ? node.seconds_since_heartbeat.toFixed(1) + " s ago" : "-", "num"));
    row.appendChild(cell(worker ? String(node.progress.step) : "", "num"));
    row.appendChild(cell(worker ? String(node.progress.epoch) : "", "num"));
    row.appendChild(cell(worker ? node.progress.loss.toFixed(4) : "", "num"));
    row.appendChild(cell(worker ? String(Math.round(node.progress.samples_per_sec)) : "", "num"));
    body.appendChild(row);
  }
  drawChart(document.getElementById("loss-chart"),
            history.map(s => ({worker: s.worker, points: s.points.map(p => ({step: p.step, value: p.loss}))})),
            null, "loss", true, total);
  // One point per evaluation: where the reported accuracy changes.
  const evaluations = history.map(s => {
    const points = [];
    for (const p of s.points) {
      const at = p.accuracy_step > 0 ? p.accuracy_step : p.step;
      if (p.test_accuracy > 0 && (points.length === 0 || points[points.length - 1].step !== at))
        points.push({step: at, value: p.test_accuracy});
    }
    return {worker: s.worker, points};
  }).filter(s => s.points.length > 0);
  // The final evaluation, on the weights after the last step.
  if (status.has_result && total > 0) {
    if (evaluations.length === 0) evaluations.push({worker: "final", points: []});
    evaluations[0].points.push({step: total, value: status.test_accuracy});
  }
  drawChart(document.getElementById("accuracy-chart"), evaluations, [0, 1], auc ? "AUC" : "accuracy", false, total);
  document.getElementById("legend").innerHTML = history.map((s, i) =>
      '<span><i style="background:' + colors[i % colors.length] + '"></i>' + s.worker + "</span>").join("");
}

async function refresh() {
  try {
    const response = await fetch("/api/status", {cache: "no-store"});
    if (!response.ok) throw new Error("HTTP " + response.status);
    lastGood = await response.json();
    lastGoodAt = new Date();
    document.getElementById("notice").textContent = "";
    show(lastGood, true);
  } catch (error) {
    if (lastGood === null) {
      document.getElementById("verdict").textContent = "cannot reach the scheduler";
      document.getElementById("notice").textContent = String(error);
      return;
    }
    // The job (or the scheduler) has ended: keep its last view readable.
    document.getElementById("notice").textContent = (lastGood.has_result ? "The job has ended" :
        "The scheduler stopped answering") + " at about " + lastGoodAt.toLocaleTimeString() +
        "; this is the last status it gave.";
    if (!lastGood.has_result) document.getElementById("verdict").className = "gone";
  }
}
if (window.FINAL_STATUS) {
  show(window.FINAL_STATUS, false);
  document.getElementById("notice").textContent = "Final report, written when the job ended.";
} else {
  refresh();
  setInterval(refresh, 1000);
}
