// Each row says in text whether the grammar allows the token, so the page reads without colour too.
const MARK = {
  drawn: { mark: "★", word: "抽到" },
  allowed: { mark: "✓", word: "允许" },
  forbidden: { mark: "✗", word: "禁止" },
};

// Probabilities come with 3 significant digits; tiny ones would read as 0.000.
function prob(x) { return x === 0 || x >= 0.001 ? x.toFixed(3) : x.toPrecision(2); }

// 1 − m when m is tiny: enough digits that it does not read as exactly 1.
function complement(kept, removed) {
  if (kept === 0 || kept >= 0.001) return prob(removed);
  const digits = Math.ceil(-Math.log10(kept)) + 1;
  return digits > 8 ? "≈ 1" : (1 - kept).toFixed(digits);
}

function logValue(x) { return x === null ? "−∞" : x.toFixed(2).replace("-", "−"); }

// Newlines, spaces and the end of text would vanish in a cell.
function shown(token, eos) {
  if (eos) return "EOS";
  return token.replace(/\n/g, "↵").replace(/ /g, "␣") || "∅";
}

function currentRun(model) {
  const runs = model.get("runs");
  return runs.find((run) => run.case === model.get("case")) || runs[0];
}

function massBar(frame, vocab) {
  const box = el("div", "dl-cons-mass");
  const track = el("div", "dl-cons-mass-track");
  const kept = el("div", "dl-cons-mass-kept");
  kept.style.width = `${100 * frame.kept}%`;
  track.append(kept, el("div", "dl-cons-mass-removed"));
  const words = el("div", "dl-cons-mass-words");
  words.dataset.allowed = String(frame.allowed);
  words.textContent = `允许 ${frame.allowed} / ${vocab} 个 token（EOS ${frame.eos_allowed ? "允许" : "不允许"}）· ` +
    `保留 m = ${prob(frame.kept)} · 掩掉 1 − m = ${complement(frame.kept, frame.removed)}`;
  box.append(track, words);
  return box;
}

function tokenRows(frame, eosId) {
  const table = el("div", "dl-cons-rows");
  table.dataset.tokens = frame.rows.map((row) => row.token).join("|");
  table.dataset.allowed = frame.rows.map((row) => (row.allowed ? "1" : "0")).join("");
  const head = el("div", "dl-cons-row dl-cons-header");
  for (const text of ["排名", "token", "语法", "p 浅 · q 深", "p", "q"]) head.append(el("span", "", text));
  table.append(head);
  const scale = Math.max(...frame.rows.map((row) => Math.max(row.p, row.q)), 1e-12);
  for (const row of frame.rows) {
    const kind = row.drawn ? "drawn" : row.allowed ? "allowed" : "forbidden";
    const line = el("div", `dl-cons-row dl-cons-${row.allowed ? "allowed" : "forbidden"}` +
                           (row.drawn ? " dl-cons-drawn" : ""));
    line.dataset.token = row.token;
    const track = el("div", "dl-cons-track");
    const before = el("div", "dl-cons-bar-p");
    before.style.width = `${(100 * row.p) / scale}%`;
    const after = el("div", "dl-cons-bar-q");
    after.style.width = `${(100 * row.q) / scale}%`;
    track.append(before, after);
    const token = el("span", "dl-cons-token");
    token.append(el("span", "dl-cons-token-text", shown(row.token, row.id === eosId)));
    line.append(el("span", "dl-cons-rank", `#${row.rank}`), token,
                el("span", "dl-cons-mark", `${MARK[kind].mark} ${MARK[kind].word}`), track,
                el("span", "dl-cons-value dl-cons-p", prob(row.p)),
                el("span", "dl-cons-value dl-cons-q", row.allowed ? prob(row.q) : "—"));
    table.append(line);
  }
  return table;
}

function restLine(frame) {
  const parts = [];
  if (frame.rest_allowed) {
    parts.push(`其余允许的 ${frame.rest_allowed} 个 token：p 合计 ${prob(frame.rest_allowed_p)}，` +
               `q 合计 ${prob(frame.rest_allowed_q)}`);
  }
  if (frame.rest_forbidden) {
    parts.push(`其余被禁止的 ${frame.rest_forbidden} 个 token：p 合计 ${prob(frame.rest_forbidden_p)}`);
  }
  return el("div", "dl-cons-rest", parts.length ? parts.join("；") : "词表里的 token 都在上面");
}

function finalLine(run, frame) {
  const logQ = frame.log_q;
  const logP = frame.log_p;
  if (run.log_z === null || logQ === null || logP === null || !frame.eos) return null;
  const conditional = logP - run.log_z;
  const gap = logQ - conditional;
  const line = el("div", "dl-cons-final");
  line.textContent = `整句写完：log p(x | valid) = log p − log Z = ${logValue(logP)} − (${logValue(run.log_z)}) = ` +
    `${logValue(conditional)}（Z：${run.log_z_source || "给定"}）。log q − log p(x | valid) = ${logValue(gap)}：` +
    (gap > 0 ? `带掩码采样抽到这句的概率是条件分布的 e^${gap.toFixed(1)} 倍。`
             : `带掩码采样抽到这句的概率只有条件分布的 e^${gap.toFixed(1)}。`);
  return line;
}

function drawFrame(body, run, index) {
  const frame = run.steps[index];
  body.replaceChildren();
  const head = el("div", "dl-cons-head");
  head.dataset.step = String(frame.step);
  head.textContent = `第 ${frame.step} 步 · ${run.params}`;
  body.append(head);
  if (run.description) body.append(el("div", "dl-cons-description", run.description));

  body.append(el("div", "dl-cons-caption", "到这一步为止的文本（灰 = prompt；下划线 = 这一步抽到的 token）"));
  const context = el("div", "dl-cons-context");
  const before = index ? run.steps[index - 1].text : "";
  context.append(el("span", "dl-cons-prompt", run.prompt || "（空 prompt）"), el("span", "", before),
                 el("span", "dl-cons-new", frame.eos ? "[EOS]" : frame.text.slice(before.length)));
  body.append(context);

  body.append(el("div", "dl-cons-caption", "这一步的掩码：绿色 = 允许的 token 在 p 里的概率 m，斜线 = 被掩掉的 1 − m"));
  body.append(massBar(frame, run.vocab_size));
  body.append(el("div", "dl-cons-caption",
                 "模型的下一个 token 分布 p 的前几名（再加上概率最高的几个允许的 token 和抽到的 token），按 p 排序"));
  body.append(tokenRows(frame, run.eos_id), restLine(frame));

  const stats = el("div", "dl-cons-stats");
  stats.dataset.logQ = String(frame.log_q);
  stats.dataset.logP = String(frame.log_p);
  const gap = frame.log_q !== null && frame.log_p !== null ? logValue(frame.log_q - frame.log_p) : "∞";
  stats.textContent = `到这一步为止：log q = ${logValue(frame.log_q)}，log p = ${logValue(frame.log_p)}，` +
    `log q − log p = −Σ log m = ${gap}`;
  body.append(stats);
  const last = finalLine(run, frame);
  if (last) body.append(last);
  body.append(el("div", "dl-cons-summary", frame.summary));
}

function render({ model, el: root }) {
  const box = el("div", "dl-cons");
  const style = el("style", "", `
    .dl-cons { font-family: sans-serif; font-size: 13px; max-width: 860px; line-height: 1.45; }
    .dl-cons.dl-lecture { font-size: 19px; max-width: 1200px; }
    .dl-cons-title { font-weight: 600; }
    .dl-cons-controls { display: flex; flex-wrap: wrap; gap: 6px 10px; align-items: center; margin: 4px 0 6px; }
    .dl-cons-controls button, .dl-cons-controls select { font-size: inherit; padding: 2px 10px; max-width: 100%; }
    .dl-cons-controls input[type=range] { flex: 1 1 8em; min-width: 6em; max-width: 20em; }
    .dl-cons-head { font-weight: 600; margin: 4px 0 2px; }
    .dl-cons-description { color: #333; overflow-wrap: anywhere; }
    .dl-cons-caption { color: #666; margin: 8px 0 3px; }
    .dl-cons-context { border: 1px solid #ccc; border-radius: 3px; padding: 4px 6px; background: #fafafa;
                       overflow-wrap: anywhere; word-break: break-all; font-size: 1.1em; }
    .dl-cons-prompt { color: #777; margin-right: 0.3em; }
    .dl-cons-new { text-decoration: underline; text-decoration-thickness: 2px; text-underline-offset: 3px;
                   background: #fff3bf; }
    .dl-cons-mass-track { display: flex; height: 14px; border: 1px solid #999; border-radius: 2px; overflow: hidden; }
    .dl-cons-mass-kept { background: #2da44e; flex: none; }
    .dl-cons-mass-removed { flex: 1 1 auto;
      background: repeating-linear-gradient(135deg, #d0d0d0 0 4px, #f4f4f4 4px 8px); }
    .dl-cons-mass-words { margin-top: 2px; font-variant-numeric: tabular-nums; }
    .dl-cons-rows { display: grid; grid-template-columns: auto auto auto minmax(2em, 1fr) auto auto;
                    gap: 1px 0.5em; align-items: center; }
    .dl-cons-row { display: contents; }
    .dl-cons-header span { color: #666; font-size: 0.9em; border-bottom: 1px solid #ddd; }
    .dl-cons-header span:nth-child(n+5) { text-align: right; }
    .dl-cons-rank { color: #888; font-size: 0.9em; font-variant-numeric: tabular-nums; text-align: right; }
    .dl-cons-token { font-size: 1.25em; font-weight: 600; text-align: center; min-width: 1.6em; }
    .dl-cons-mark, .dl-cons-value { white-space: nowrap; font-variant-numeric: tabular-nums; }
    .dl-cons-value { text-align: right; }
    .dl-cons-track { position: relative; height: 16px; background: #f3f3f3; min-width: 2em; }
    .dl-cons-bar-p, .dl-cons-bar-q { position: absolute; left: 0; }
    .dl-cons-bar-p { top: 0; height: 100%; background: #b9d0ec; }
    .dl-cons-bar-q { top: 20%; height: 60%; background: #2f6db5; }
    .dl-cons-allowed .dl-cons-mark { color: #1a7f37; }
    .dl-cons-forbidden .dl-cons-token, .dl-cons-forbidden .dl-cons-mark, .dl-cons-forbidden .dl-cons-value,
    .dl-cons-forbidden .dl-cons-rank { color: #999; }
    .dl-cons-forbidden .dl-cons-bar-p { background: #d6d6d6; }
    /* A drawn line, not text-decoration: Chromium skips line-through with some CJK fonts. */
    .dl-cons-forbidden .dl-cons-token-text { position: relative; display: inline-block; padding: 0 2px; }
    .dl-cons-forbidden .dl-cons-token-text::after { content: ""; position: absolute; left: 0; right: 0; top: 52%;
                                                     border-top: 2px solid currentColor; }
    .dl-cons-drawn > span { background: #fff3bf; }
    .dl-cons-drawn .dl-cons-mark { color: #0a3069; font-weight: 600; }
    .dl-cons-drawn .dl-cons-token-text { text-decoration: underline; text-decoration-thickness: 2px;
                                         text-underline-offset: 3px; }
    .dl-cons-rest { color: #555; margin-top: 3px; font-size: 0.92em; }
    .dl-cons-stats { margin-top: 8px; font-variant-numeric: tabular-nums; }
    .dl-cons-final { margin-top: 4px; font-weight: 600; }
    .dl-cons-summary { margin-top: 6px; }
    .dl-cons-legend { margin-top: 8px; color: #555; font-size: 0.92em; }
  `);
  const choices = el("div", "dl-cons-controls");
  const caseSelect = el("select", "dl-cons-case");
  caseSelect.setAttribute("aria-label", "例子");
  for (const run of model.get("runs")) {
    const option = el("option", "", run.case);
    option.value = run.case;
    caseSelect.append(option);
  }
  choices.append(el("label", "", "例子："), caseSelect);
  const controls = el("div", "dl-cons-controls");
  const prev = el("button", "dl-cons-prev", "◀ 上一步");
  const next = el("button", "dl-cons-next", "下一步 ▶");
  const slider = el("input", "dl-cons-slider");
  slider.type = "range";
  slider.min = "0";
  slider.setAttribute("aria-label", "步");
  const label = el("span", "dl-cons-label");
  controls.append(prev, next, slider, label);
  const body = el("div", "dl-cons-body");
  const legend = el("div", "dl-cons-legend",
    "✓ 允许 · ✗ 禁止（灰、删除线）· ★ 抽到的 token（黄底）· 浅色条 = 模型的 p，深色条 = 掩码并重新归一化之后的 q；" +
    "q 是带掩码的采样真正用来抽 token 的分布");
  box.append(style, el("div", "dl-cons-title", model.get("title")), choices, controls, body, legend);
  root.append(box);

  const redraw = () => {
    const run = currentRun(model);
    const index = Math.max(0, Math.min(model.get("index"), run.steps.length - 1));
    box.classList.toggle("dl-lecture", model.get("lecture"));
    caseSelect.value = run.case;
    slider.max = String(run.steps.length - 1);
    slider.value = String(index);
    label.textContent = `第 ${index + 1} / ${run.steps.length} 步`;
    prev.disabled = index === 0;
    next.disabled = index === run.steps.length - 1;
    drawFrame(body, run, index);
  };
  const go = (index) => { model.set("index", index); model.save_changes(); redraw(); };
  // Another case is another generation: start it from its first step.
  caseSelect.addEventListener("change", () => { model.set("case", caseSelect.value); go(0); });
  prev.addEventListener("click", () => go(Math.max(0, model.get("index") - 1)));
  next.addEventListener("click", () => go(Math.min(currentRun(model).steps.length - 1, model.get("index") + 1)));
  slider.addEventListener("input", () => go(parseInt(slider.value, 10)));
  return follow(model, ["runs", "case", "index", "lecture", "title"], redraw);
}

export default { render };
