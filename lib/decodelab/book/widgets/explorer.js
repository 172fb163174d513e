// The distribution explorer's view. No imports, no network: it runs live in JupyterLab and, from the
// saved widget state, in the static HTML book. computeState mirrors decodelab.book.widgets.explorer.explorer_state.

export function computeState(logits, params) {
  const n = logits.length;
  const scaled = logits.map((x) => x / params.temperature);
  const maxScaled = Math.max(...scaled);
  const exps = scaled.map((x) => Math.exp(x - maxScaled));
  const total = exps.reduce((a, b) => a + b, 0);
  const probs = exps.map((x) => x / total);
  const kept = new Array(n).fill(true);
  if (params.top_k > 0 && params.top_k < n) {
    const kthLargest = [...scaled].sort((a, b) => b - a)[params.top_k - 1];
    for (let i = 0; i < n; i++) kept[i] = kept[i] && scaled[i] >= kthLargest;
  }
  if (params.top_p < 1.0) {
    let filtered = probs.map((p, i) => (kept[i] ? p : 0));
    const filteredTotal = filtered.reduce((a, b) => a + b, 0);
    filtered = filtered.map((p) => p / filteredTotal);
    const order = [...Array(n).keys()].sort((a, b) => filtered[b] - filtered[a] || a - b);
    let massBefore = 0;
    order.forEach((index, rank) => {
      const inNucleus = rank === 0 || massBefore < params.top_p;
      kept[index] = kept[index] && inNucleus;
      massBefore += filtered[index];
    });
  }
  if (params.min_p > 0) {
    const maxProb = Math.max(...probs);
    for (let i = 0; i < n; i++) kept[i] = kept[i] && probs[i] >= params.min_p * maxProb;
  }
  const keptMass = probs.reduce((a, p, i) => a + (kept[i] ? p : 0), 0);
  const finalProbs = probs.map((p, i) => (kept[i] ? p / keptMass : 0));
  const entropy = (ps) => ps.reduce((a, p) => (p > 0 ? a - p * Math.log(p) : a), 0);
  return {
    probs,
    kept,
    final_probs: finalProbs,
    entropy: entropy(probs),
    final_entropy: entropy(finalProbs),
    kept_count: kept.filter(Boolean).length,
    kept_mass: keptMass,
  };
}

function paramsOf(model) {
  return {
    temperature: model.get("temperature"),
    top_k: model.get("top_k"),
    top_p: model.get("top_p"),
    min_p: model.get("use_min_p") ? model.get("min_p") : 0,
  };
}

function element(tag, className, text) {
  const node = document.createElement(tag);
  // JupyterLab binds the arrow keys to notebook navigation; this lets sliders and buttons keep them.
  if (tag === "input" || tag === "button" || tag === "select") node.dataset.lmSuppressShortcuts = "true";
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function slider(model, listen, name, label, min, max, step, format) {
  const row = element("label", "dl-explorer-control");
  const title = element("span", "dl-explorer-control-name", label);
  const input = element("input");
  Object.assign(input, { type: "range", min, max, step, value: model.get(name) });
  input.dataset.param = name;
  input.setAttribute("aria-label", label);
  const value = element("span", "dl-explorer-control-value", format(model.get(name)));
  input.addEventListener("input", () => {
    const number = name === "top_k" ? parseInt(input.value, 10) : parseFloat(input.value);
    model.set(name, number);
    model.save_changes();
  });
  listen(name, () => {
    input.value = model.get(name);
    value.textContent = format(model.get(name));
  });
  row.append(title, input, value);
  return row;
}

function minPToggle(model, listen) {
  const row = element("label", "dl-explorer-control");
  const box = element("input");
  Object.assign(box, { type: "checkbox", checked: model.get("use_min_p") });
  box.dataset.param = "use_min_p";
  box.addEventListener("change", () => {
    model.set("use_min_p", box.checked);
    model.save_changes();
  });
  listen("use_min_p", () => {
    box.checked = model.get("use_min_p");
  });
  row.append(box, element("span", "dl-explorer-control-name", "启用 min-p"));
  return row;
}

const percent = (p) => `${(100 * p).toFixed(1)}%`;

function drawContext(panel, context, params, numBars) {
  const state = computeState(context.logits, params);
  const order = [...context.logits.keys()].sort((a, b) => context.logits[b] - context.logits[a] || a - b);
  const shown = order.slice(0, numBars);
  const scale = Math.max(...shown.map((i) => Math.max(state.probs[i], state.final_probs[i])));
  panel.replaceChildren();
  panel.append(element("div", "dl-explorer-title", context.label));
  const bars = element("div", "dl-explorer-bars");
  for (const i of shown) {
    const row = element("div", state.kept[i] ? "dl-explorer-row dl-kept" : "dl-explorer-row dl-removed");
    row.dataset.token = context.tokens[i];
    row.dataset.prob = state.final_probs[i].toFixed(6);
    const track = element("div", "dl-explorer-track");
    const before = element("div", "dl-explorer-bar-before");
    before.style.width = `${(100 * state.probs[i]) / scale}%`;
    const after = element("div", "dl-explorer-bar-after");
    after.style.width = `${(100 * state.final_probs[i]) / scale}%`;
    track.append(before, after);
    const shownValue = state.kept[i] ? percent(state.final_probs[i]) : `删去 (${percent(state.probs[i])})`;
    row.append(element("span", "dl-explorer-token", context.tokens[i]), track, element("span", "dl-explorer-value", shownValue));
    bars.append(row);
  }
  const rest = order.length - shown.length;
  if (rest > 0) {
    const restMass = order.slice(numBars).reduce((a, i) => a + state.final_probs[i], 0);
    bars.append(element("div", "dl-explorer-rest", `其余 ${rest} 个 token 合计 ${percent(restMass)}`));
  }
  panel.append(bars);
  const stats = element("div", "dl-explorer-stats");
  stats.dataset.entropy = state.final_entropy.toFixed(6);
  stats.dataset.keptCount = String(state.kept_count);
  stats.textContent =
    `熵 ${state.final_entropy.toFixed(3)} nats（≈ ${Math.exp(state.final_entropy).toFixed(1)} 个等可能候选）` +
    ` · 保留 ${state.kept_count} / ${order.length} 个 token，原概率质量 ${percent(state.kept_mass)}`;
  panel.append(stats);
}

function render({ model, el }) {
  const listeners = [];
  const listen = (name, callback) => {
    model.on(`change:${name}`, callback);
    listeners.push([`change:${name}`, callback]);
  };
  const root = element("div", "dl-explorer");
  const controls = element("div", "dl-explorer-controls");
  controls.append(
    slider(model, listen, "temperature", "temperature T", 0.05, 3.0, 0.05, (v) => v.toFixed(2)),
    slider(model, listen, "top_k", "top-k", 0, 50, 1, (v) => (v === 0 ? "关" : String(v))),
    slider(model, listen, "top_p", "top-p", 0.05, 1.0, 0.01, (v) => (v >= 1 ? "关" : v.toFixed(2))),
    slider(model, listen, "min_p", "min-p", 0.0, 0.5, 0.01, (v) => v.toFixed(2)),
    minPToggle(model, listen),
  );
  const panels = element("div", "dl-explorer-panels");
  const legend = element(
    "div",
    "dl-explorer-legend",
    "浅色：除以 T 之后、过滤之前的概率；深色：过滤并重新归一化之后真正用来采样的概率；灰色行：被删去的 token。",
  );
  root.append(controls, panels, legend);
  el.append(root);

  const redraw = () => {
    root.classList.toggle("dl-lecture", model.get("lecture"));
    const params = paramsOf(model);
    const contexts = model.get("contexts");
    panels.replaceChildren();
    for (const context of contexts) {
      const panel = element("div", "dl-explorer-panel");
      drawContext(panel, context, params, model.get("num_bars"));
      panels.append(panel);
    }
  };
  for (const name of ["contexts", "temperature", "top_k", "top_p", "min_p", "use_min_p", "num_bars", "lecture"]) {
    listen(name, redraw);
  }
  redraw();
  return () => {
    for (const [event, callback] of listeners) model.off(event, callback);
  };
}

export default { render };
