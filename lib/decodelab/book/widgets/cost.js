export function costState(m, g, batch, context, dtypeBytes) {
  const weightBytes = m.num_params * dtypeBytes;
  const kvPerSequence = 2 * m.num_layers * m.num_kv_heads * m.head_dim * dtypeBytes * context;
  const kvBytes = kvPerSequence * batch;
  const memory = g.memory_gb * 1e9;
  const maxBatch = Math.max(0, Math.floor((memory - weightBytes) / kvPerSequence));
  const stepFlops = 2 * m.num_params * batch + 4 * m.num_layers * m.num_heads * m.head_dim * context * batch;
  const stepBytes = weightBytes + kvBytes;
  const memoryMs = 1e3 * stepBytes / (g.bandwidth_tb_s * 1e12);
  const computeMs = 1e3 * stepFlops / (g.bf16_tflops * 1e12);
  const stepMs = Math.max(memoryMs, computeMs);
  const prefillFlops = 2 * m.num_params * context + 2 * m.num_layers * m.num_heads * m.head_dim * context * context;
  return { weight_bytes: weightBytes, kv_bytes: kvBytes, fits: weightBytes + kvBytes <= memory, max_batch: maxBatch,
           intensity: stepFlops / stepBytes, ridge: g.bf16_tflops / g.bandwidth_tb_s, memory_ms: memoryMs,
           compute_ms: computeMs, step_ms: stepMs, tokens_per_s: 1e3 * batch / stepMs,
           prefill_ms: 1e3 * prefillFlops / (g.bf16_tflops * 1e12) };
}

const gb = (bytes) => `${(bytes / 1e9).toFixed(1)} GB`;

function select(model, name, label, options) {
  const row = el("label", "dl-cost-control");
  const input = el("select");
  input.dataset.param = name;
  options.forEach((text, i) => input.append(Object.assign(el("option", "", text), { value: String(i) })));
  input.value = String(model.get(name));
  input.addEventListener("change", () => { model.set(name, parseInt(input.value, 10)); model.save_changes(); });
  row.append(el("span", "dl-cost-name", label), input);
  return [row, () => { input.value = String(model.get(name)); }];
}

function render({ model, el: root }) {
  const box = el("div", "dl-cost");
  box.append(el("style", "", `
    .dl-cost { font-family: sans-serif; font-size: 13px; max-width: 820px; }
    .dl-cost.dl-lecture { font-size: 19px; max-width: 1200px; }
    .dl-cost-controls { display: flex; flex-wrap: wrap; gap: 6px 16px; margin-bottom: 8px; }
    .dl-cost-name { margin-right: 6px; }
    .dl-cost select { font-size: inherit; }
    .dl-cost-bar { display: flex; height: 1.6em; border: 1px solid #888; margin: 4px 0; position: relative; }
    .dl-cost-weights { background: #8fb3d9; } .dl-cost-kv { background: #e8a87c; }
    .dl-cost-over { outline: 2px solid #c0392b; }
    .dl-cost table { border-collapse: collapse; } .dl-cost td { padding: 1px 10px 1px 0; }
  `));
  const models = model.get("models"), gpus = model.get("gpus");
  const batches = model.get("batch_sizes"), contexts = model.get("context_lens");
  const controls = el("div", "dl-cost-controls");
  const syncs = [];
  for (const [name, label, options] of [
    ["model_index", "模型", models.map((m) => m.name)], ["gpu_index", "GPU", gpus.map((g) => g.name)],
    ["batch_index", "batch", batches.map(String)], ["context_index", "每条序列的 token 数", contexts.map(String)],
  ]) {
    const [row, sync] = select(model, name, label, options);
    controls.append(row);
    syncs.push(sync);
  }
  const body = el("div", "dl-cost-body");
  box.append(controls, body);
  root.append(box);

  const redraw = () => {
    syncs.forEach((sync) => sync());
    box.classList.toggle("dl-lecture", model.get("lecture"));
    const m = models[model.get("model_index")], g = gpus[model.get("gpu_index")];
    const batch = batches[model.get("batch_index")], context = contexts[model.get("context_index")];
    const s = costState(m, g, batch, context, 2);
    body.replaceChildren();
    const memory = g.memory_gb * 1e9, scale = Math.max(memory, s.weight_bytes + s.kv_bytes);
    const bar = el("div", s.fits ? "dl-cost-bar" : "dl-cost-bar dl-cost-over");
    const w = el("div", "dl-cost-weights"); w.style.width = `${100 * s.weight_bytes / scale}%`;
    const k = el("div", "dl-cost-kv"); k.style.width = `${100 * s.kv_bytes / scale}%`;
    bar.append(w, k);
    body.append(el("div", "", `显存 ${g.memory_gb} GB：蓝 = 权重 ${gb(s.weight_bytes)}，橙 = KV cache ${gb(s.kv_bytes)}` +
                              (s.fits ? "，放得下" : "，放不下（爆显存）")), bar);
    const table = el("table", "dl-cost-table");
    const rows = [
      ["这个长度最多同时放几条序列", `${s.max_batch}`],
      ["decode 一步读的字节 / 做的 FLOPs", `${gb(s.weight_bytes + s.kv_bytes)} / ${(s.intensity * (s.weight_bytes + s.kv_bytes) / 1e12).toFixed(2)} TFLOP`],
      ["arithmetic intensity（FLOPs / 字节）", `${s.intensity.toFixed(1)}（GPU 的平衡点 ${s.ridge.toFixed(0)}）`],
      ["一步的下界：读显存 / 算", `${s.memory_ms.toFixed(2)} ms / ${s.compute_ms.toFixed(2)} ms → ${s.memory_ms >= s.compute_ms ? "memory-bound" : "compute-bound"}`],
      ["decode 吞吐上界", `${s.tokens_per_s.toFixed(0)} tokens/s（每条序列 ${(1e3 / s.step_ms).toFixed(0)} tokens/s）`],
      ["prefill 一条 prompt 的算力下界（TTFT）", `${s.prefill_ms.toFixed(1)} ms`],
    ];
    for (const [name, value] of rows) {
      const tr = el("tr");
      tr.append(el("td", "", name), el("td", "dl-cost-value", value));
      tr.dataset.name = name;
      table.append(tr);
    }
    body.append(table);
    body.dataset.stepMs = s.step_ms.toFixed(6);
    body.dataset.maxBatch = String(s.max_batch);
  };
  return follow(model, ["model_index", "gpu_index", "batch_index", "context_index", "lecture"], redraw);
}

export default { render };
