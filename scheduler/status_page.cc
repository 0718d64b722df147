#include "scheduler/status_page.h"

#include "google/protobuf/util/json_util.h"

namespace paramserver {

const std::string& StatusPageHtml() {
  static const std::string* const html = new std::string(R"HTML(<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>paramserver: job status</title>
<style>
  body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
  h1 { font-size: 1.3em; margin: 0 0 .3em; }
  #verdict { font-size: 1.1em; font-weight: 600; }
  table { border-collapse: collapse; margin: 1em 0; }
  th, td { padding: .2em .8em; text-align: left; border-bottom: 1px solid #ddd; }
  td.num { text-align: right; font-variant-numeric: tabular-nums; }
  .alive { color: #1a7f37; } .suspect { color: #b08800; } .dead { color: #cf222e; }
  .charts { display: flex; gap: 2em; flex-wrap: wrap; }
  svg { border: 1px solid #ccc; background: #fafafa; }
  .legend span { margin-right: 1em; }
</style>
</head>
<body>
<h1>paramserver job</h1>
<div id="verdict">loading...</div>
<div id="summary"></div>
<table id="nodes"><thead><tr><th>node</th><th>role</th><th>address</th><th>health</th>
<th>heartbeat</th><th>step</th><th>epoch</th><th>loss</th><th>samples/s</th></tr></thead><tbody></tbody></table>
<div class="charts">
  <div><div>training loss</div><svg id="loss-chart" width="460" height="240"></svg></div>
  <div><div>test accuracy (worker-0)</div><svg id="accuracy-chart" width="460" height="240"></svg></div>
</div>
<div class="legend" id="legend"></div>
<script>
const colors = ["#0969da", "#cf222e", "#1a7f37", "#8250df", "#bc4c00", "#116329", "#a40e26", "#0550ae"];

function cell(text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  return td;
}

function drawChart(svg, series, value) {
  const width = svg.width.baseVal.value, height = svg.height.baseVal.value, pad = 30;
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  let maxStep = 1, lo = Infinity, hi = -Infinity;
  for (const s of series) for (const p of s.points) {
    const v = value(p);
    if (v === null) continue;
    maxStep = Math.max(maxStep, Number(p.step));
    lo = Math.min(lo, v); hi = Math.max(hi, v);
  }
  if (!isFinite(lo)) return 0;
  if (hi - lo < 1e-9) { hi = lo + 1; }
  const ns = "http://www.w3.org/2000/svg";
  const axis = document.createElementNS(ns, "text");
  axis.setAttribute("x", 4); axis.setAttribute("y", 12); axis.setAttribute("font-size", "10");
  axis.textContent = hi.toFixed(3) + " .. " + lo.toFixed(3) + "  (step 0.." + maxStep + ")";
  svg.appendChild(axis);
  let total = 0;
  series.forEach((s, i) => {
    const coords = [];
    for (const p of s.points) {
      const v = value(p);
      if (v === null) continue;
      const x = pad + (width - 2 * pad) * Number(p.step) / maxStep;
      const y = height - pad - (height - 2 * pad) * (v - lo) / (hi - lo);
      coords.push(x.toFixed(1) + "," + y.toFixed(1));
    }
    if (coords.length === 0) return;
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("points", coords.join(" "));
    line.setAttribute("fill", "none");
    line.setAttribute("stroke", colors[i % colors.length]);
    line.setAttribute("stroke-width", "1.5");
    line.setAttribute("data-worker", s.worker);
    svg.appendChild(line);
    total += coords.length;
  });
  svg.setAttribute("data-points", String(total));
  return total;
}

async function refresh() {
  try {
    const response = await fetch("/api/status", {cache: "no-store"});
    const status = await response.json();
    document.getElementById("verdict").textContent = status.verdict;
    let summary = "epoch " + status.epoch + ", mode " + status.mode + ", replication " + status.replication;
    if (status.slowestWorker) {
      summary += "; slowest " + status.slowestWorker + " at step " + status.slowestStep +
                 " (" + (Number(status.fastestStep) - Number(status.slowestStep)) + " behind); " +
                 Math.round(status.samplesPerSec) + " samples/s";
    }
    if (status.hasResult) summary += "; final test accuracy " + status.testAccuracy.toFixed(4);
    document.getElementById("summary").textContent = summary;
    const body = document.querySelector("#nodes tbody");
    body.innerHTML = "";
    for (const node of status.nodes) {
      const worker = node.role === "NODE_ROLE_WORKER";
      const health = node.health.replace("NODE_HEALTH_", "").toLowerCase();
      const row = document.createElement("tr");
      row.appendChild(cell(node.name));
      row.appendChild(cell(worker ? "worker" : "server"));
      row.appendChild(cell(node.address));
      row.appendChild(cell(health, health));
      row.appendChild(cell(node.secondsSinceHeartbeat.toFixed(1) + " s ago", "num"));
      row.appendChild(cell(worker ? String(node.progress.step) : "", "num"));
      row.appendChild(cell(worker ? String(node.progress.epoch) : "", "num"));
      row.appendChild(cell(worker ? node.progress.loss.toFixed(4) : "", "num"));
      row.appendChild(cell(worker ? Math.round(node.progress.samplesPerSec) : "", "num"));
      body.appendChild(row);
    }
    const history = status.history || [];
    drawChart(document.getElementById("loss-chart"), history, p => p.loss);
    drawChart(document.getElementById("accuracy-chart"), history,
              p => (p.testAccuracy > 0 ? p.testAccuracy : null));
    document.getElementById("legend").innerHTML = history.map((s, i) =>
        '<span style="color:' + colors[i % colors.length] + '">' + s.worker + "</span>").join("");
  } catch (error) {
    document.getElementById("verdict").textContent = "cannot reach the scheduler: " + error;
  }
}
refresh();
setInterval(refresh, 1000);
</script>
</body>
</html>
)HTML");
  return *html;
}

std::string StatusJson(const ClusterStatus& status) {
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  std::string json;
  (void)google::protobuf::util::MessageToJsonString(status, &json, options);
  return json;
}

}  // namespace paramserver
