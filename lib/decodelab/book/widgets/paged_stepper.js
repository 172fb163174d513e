const KIND = { start: "开始", prefill: "prefill", decode: "decode", idle: "空闲" };

function hue(request) { return (request * 67 + 200) % 360; }

function drawFrame(body, frame, model) {
  const blockSize = model.get("block_size");
  body.replaceChildren();
  const head = el("div", "dl-paged-head");
  head.dataset.step = String(frame.step);
  head.textContent = `第 ${frame.step} 步 · ${KIND[frame.kind] || frame.kind}` +
    ` · 运行 ${frame.sequences.length} 条序列 · 等待的请求 ${frame.waiting.length ? frame.waiting.join("、") : "无"}` +
    ` · 槽位利用率 ${frame.allocated_slots ? (100 * frame.live_tokens / frame.allocated_slots).toFixed(0) : "—"}%` +
    `（${frame.live_tokens} / ${frame.allocated_slots}）`;
  body.append(head);
  const events = el("ul", "dl-paged-events");
  for (const text of frame.events.length ? frame.events : ["（没有请求到达或完成）"]) events.append(el("li", "", text));
  body.append(events);

  const owner = new Map();
  for (const seq of frame.sequences) for (const b of seq.blocks) if (!owner.has(b)) owner.set(b, seq.request);
  body.append(el("div", "dl-paged-caption", "KV block 池（物理块）：颜色 = 所属请求，×n = reference count，灰色 = free"));
  const pool = el("div", "dl-paged-pool");
  frame.ref_counts.forEach((ref, b) => {
    const cell = el("div", "dl-paged-block");
    cell.dataset.block = String(b);
    cell.dataset.ref = String(ref);
    if (ref > 0) {
      cell.style.background = `hsl(${hue(owner.get(b) ?? 0)}, 70%, 85%)`;
    } else {
      cell.classList.add("dl-paged-free");
      if (frame.cached.includes(b)) cell.classList.add("dl-paged-cached");
    }
    const top = el("div", "dl-paged-block-id", `#${b}` + (ref > 1 ? ` ×${ref}` : ""));
    const slots = el("div", "dl-paged-slots");
    for (let i = 0; i < blockSize; i++) {
      const filled = i < frame.fill[b];
      slots.append(el("span", filled ? "dl-paged-slot dl-paged-slot-used" : "dl-paged-slot",
                      filled ? frame.blocks[b][i] : ""));
    }
    cell.append(top, slots);
    pool.append(cell);
  });
  body.append(pool);

  body.append(el("div", "dl-paged-caption", "block table（逻辑块 → 物理块）"));
  const tables = el("table", "dl-paged-tables");
  for (const seq of frame.sequences) {
    const row = el("tr");
    row.dataset.seq = String(seq.seq);
    row.dataset.blocks = seq.blocks.join(",");
    row.append(el("th", "", `序列 ${seq.seq}（请求 ${seq.request}${seq.sample ? `，样本 ${seq.sample}` : ""}，${seq.num_tokens} 个 token）`));
    seq.blocks.forEach((b) => {
      const cell = el("td", "dl-paged-table-cell", String(b));
      cell.style.background = `hsl(${hue(seq.request)}, 70%, 85%)`;
      if (frame.ref_counts[b] > 1) cell.classList.add("dl-paged-shared");
      row.append(cell);
    });
    tables.append(row);
  }
  if (!frame.sequences.length) tables.append(el("tr", "", "（没有运行中的序列）"));
  body.append(tables);
  const free = el("div", "dl-paged-free-queue");
  free.dataset.free = frame.free.join(",");
  free.textContent = `free 队列（先分配左边的）：${frame.free.length ? frame.free.join(" → ") : "空"}`;
  body.append(free);
}

function render({ model, el: root }) {
  const box = el("div", "dl-paged");
  const style = el("style", "", `
    .dl-paged { font-family: sans-serif; font-size: 13px; max-width: 860px; }
    .dl-paged.dl-lecture { font-size: 19px; max-width: 1200px; }
    .dl-paged-controls { display: flex; gap: 8px; align-items: center; margin-bottom: 6px; }
    .dl-paged-controls button { font-size: inherit; padding: 2px 12px; }
    .dl-paged-head { font-weight: 600; margin: 4px 0; }
    .dl-paged-events { margin: 2px 0 6px 1.2em; padding: 0; color: #444; min-height: 3.6em; }
    .dl-paged-caption { color: #666; margin: 6px 0 3px; }
    .dl-paged-pool { display: flex; flex-wrap: wrap; gap: 4px; }
    .dl-paged-block { border: 1px solid #888; border-radius: 3px; padding: 2px 3px; min-width: 4.5em; }
    .dl-paged-free { background: #eee; color: #999; }
    .dl-paged-cached { border-style: dashed; }
    .dl-paged-block-id { font-size: 0.8em; }
    .dl-paged-slots { display: flex; gap: 1px; }
    .dl-paged-slot { display: inline-block; min-width: 1.25em; overflow: hidden; height: 1.35em; text-align: center;
                     border: 1px solid #ccc; background: #fff; line-height: 1.35em; }
    .dl-paged-slot-used { border-color: #777; }
    .dl-paged-free .dl-paged-slot { background: #f6f6f6; }
    .dl-paged-tables { border-collapse: collapse; }
    .dl-paged-tables th { text-align: left; font-weight: normal; padding-right: 8px; }
    .dl-paged-table-cell { border: 1px solid #888; min-width: 2em; text-align: center; }
    .dl-paged-shared { font-weight: 700; text-decoration: underline; }
    .dl-paged-free-queue { margin-top: 6px; color: #555; }
  `);
  const controls = el("div", "dl-paged-controls");
  const prev = el("button", "dl-paged-prev", "◀ 上一步");
  const next = el("button", "dl-paged-next", "下一步 ▶");
  const slider = el("input", "dl-paged-slider");
  slider.type = "range";
  slider.min = "0";
  const label = el("span", "dl-paged-label");
  controls.append(prev, next, slider, label);
  const body = el("div", "dl-paged-body");
  box.append(style, el("div", "dl-paged-title", model.get("title")), controls, body);
  root.append(box);

  const redraw = () => {
    const frames = model.get("frames");
    const index = Math.max(0, Math.min(model.get("index"), frames.length - 1));
    box.classList.toggle("dl-lecture", model.get("lecture"));
    slider.max = String(frames.length - 1);
    slider.value = String(index);
    label.textContent = `${index} / ${frames.length - 1}`;
    prev.disabled = index === 0;
    next.disabled = index === frames.length - 1;
    drawFrame(body, frames[index], model);
  };
  const go = (index) => { model.set("index", index); model.save_changes(); redraw(); };
  prev.addEventListener("click", () => go(Math.max(0, model.get("index") - 1)));
  next.addEventListener("click", () => go(Math.min(model.get("frames").length - 1, model.get("index") + 1)));
  slider.addEventListener("input", () => go(parseInt(slider.value, 10)));
  return follow(model, ["frames", "index", "lecture", "block_size", "title"], redraw);
}

export default { render };
