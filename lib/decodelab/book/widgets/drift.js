const SVG = "http://www.w3.org/2000/svg";
function svg(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  return node;
}

function lineChart(series, yLabel, yMax, lecture) {
  const W = lecture ? 640 : 430, H = lecture ? 300 : 210, L = 48, B = 30, T = 10, R = 10;
  const root = svg("svg", { width: W, height: H, class: "dl-drift-chart" });
  const n = Math.max(...series.map((s) => s.values.length));
  const x = (i) => L + (W - L - R) * i / Math.max(1, n - 1);
  const y = (v) => T + (H - T - B) * (1 - v / yMax);
  root.append(svg("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "#888" }));
  root.append(svg("line", { x1: L, y1: T, x2: L, y2: H - B, stroke: "#888" }));
  for (const frac of [0, 0.5, 1]) {
    const t = svg("text", { x: L - 4, y: y(frac * yMax) + 4, "text-anchor": "end", "font-size": 10 });
    t.textContent = (frac * yMax).toPrecision(2);
    root.append(t);
  }
  const xl = svg("text", { x: (W + L) / 2, y: H - 4, "text-anchor": "middle", "font-size": 11 });
  xl.textContent = "位置 t（第几个字符）";
  const yl = svg("text", { x: 12, y: T + 10, "font-size": 11 });
  yl.textContent = yLabel;
  root.append(xl, yl);
  for (const s of series) {
    const points = s.values.map((v, i) => (v === null || Number.isNaN(v) ? null : `${x(i)},${y(Math.min(v, yMax))}`))
      .filter(Boolean).join(" ");
    const line = svg("polyline", { points, fill: "none", stroke: s.color, "stroke-width": 2 });
    line.dataset.series = s.name;
    root.append(line);
  }
  return root;
}

function render({ model, el: root }) {
  const box = el("div", "dl-drift");
  box.append(el("style", "", `
    .dl-drift { font-family: sans-serif; font-size: 13px; max-width: 900px; }
    .dl-drift.dl-lecture { font-size: 19px; max-width: 1300px; }
    .dl-drift-controls { display: flex; gap: 12px; align-items: center; margin-bottom: 6px; }
    .dl-drift-charts { display: flex; flex-wrap: wrap; gap: 8px; }
    .dl-drift-legend span { margin-right: 12px; }
    .dl-drift-table td, .dl-drift-table th { padding: 1px 8px; text-align: right; }
  `));
  const controls = el("label", "dl-drift-controls");
  const slider = el("input");
  Object.assign(slider, { type: "range", min: 0, max: model.get("runs").length - 1, step: 1 });
  slider.dataset.param = "run_index";
  const value = el("span", "dl-drift-value");
  controls.append(el("span", "", "free running 的 temperature"), slider, value);
  const body = el("div");
  box.append(controls, body);
  root.append(box);
  const redraw = () => {
    const runs = model.get("runs");
    const run = runs[model.get("run_index")];
    const lecture = model.get("lecture");
    box.classList.toggle("dl-lecture", lecture);
    slider.value = String(model.get("run_index"));
    value.textContent = `T = ${run.temperature}`;
    body.replaceChildren();
    const tf = run.teacher_forcing;
    const legend = el("div", "dl-drift-legend");
    const a = el("span", "", "━ teacher forcing（真实前缀）"); a.style.color = "#1f77b4";
    const b = el("span", "", `━ free running（模型自己的前缀，T = ${run.temperature}）`); b.style.color = "#d62728";
    legend.append(a, b);
    const charts = el("div", "dl-drift-charts");
    const maxMass = Math.max(0.02, ...tf.invalid_mass.filter(Number.isFinite), ...run.invalid_mass.filter(Number.isFinite));
    charts.append(
      lineChart([{ name: "tf", values: tf.invalid_mass, color: "#1f77b4" },
                 { name: "fr", values: run.invalid_mass, color: "#d62728" }], "非法字符上的概率质量", maxMass * 1.1, lecture),
      lineChart([{ name: "tf", values: tf.viable, color: "#1f77b4" },
                 { name: "fr", values: run.viable, color: "#d62728" }], "前缀仍合法的比例", 1.0, lecture));
    const summary = el("div", "dl-drift-summary",
      `T = ${run.temperature}：整句合法 ${(100 * run.valid).toFixed(1)}%，每字符真实 −log P ${run.nll.toFixed(3)} nats`);
    summary.dataset.valid = String(run.valid);
    body.append(legend, charts, summary);
  };
  slider.addEventListener("input", () => { model.set("run_index", parseInt(slider.value, 10)); model.save_changes(); });
  return follow(model, ["run_index", "runs", "lecture"], redraw);
}

export default { render };
