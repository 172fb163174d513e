// Each status has a text marker as well as a colour, so the page reads without colour too.
const STATUS = {
  accepted: { mark: "✓", word: "接受" },
  rejected: { mark: "✗", word: "拒绝" },
  unjudged: { mark: "–", word: "作废" },
};
const KIND = {
  residual: { mark: "↻", word: "残差重抽", prob: "r(x)" },
  bonus: { mark: "★", word: "bonus", prob: "p(x)" },
  plain: { mark: "●", word: "目标模型抽", prob: "p(x)" },
};

// Probabilities come with 3 significant digits; tiny ones would read as 0.000.
function prob(x) { return x === 0 || x >= 0.001 ? x.toFixed(3) : x.toPrecision(2); }

// Newlines and spaces would vanish in a chip.
function shown(token) { return token.replace(/\n/g, "↵").replace(/ /g, "␣") || "∅"; }

function chip(className, token, lines) {
  const box = el("div", `dl-spec-chip ${className}`);
  box.append(el("div", "dl-spec-token", shown(token)));
  for (const line of lines) box.append(el("div", "dl-spec-line", line));
  return box;
}

function currentRun(model) {
  const runs = model.get("runs");
  return runs.find((run) => run.draft === model.get("draft") && run.gamma === model.get("gamma")) || runs[0];
}

function drawFrame(body, run, index) {
  const frame = run.rounds[index];
  body.replaceChildren();
  const head = el("div", "dl-spec-head");
  head.dataset.round = String(frame.round);
  head.textContent = `第 ${frame.round} 轮 = 第 ${frame.forwards} 次目标前向 · draft = ${run.draft} · γ = ${run.gamma}`;
  const rate = frame.judged_total ? (frame.accepted_total / frame.judged_total).toFixed(2) : "—";
  const stats = el("div", "dl-spec-stats");
  stats.textContent = `累计 ${frame.tokens} 个 token ÷ ${frame.forwards} 次目标前向 = 每次 ` +
    `${(frame.tokens / frame.forwards).toFixed(2)} 个 · 接受率 ${rate}（${frame.accepted_total} / ` +
    `${frame.judged_total} 个被检验的提议）`;
  body.append(head, stats);

  body.append(el("div", "dl-spec-caption", "上下文（灰 = prompt；下划线 = 这一轮新增的 token）"));
  const context = el("div", "dl-spec-context");
  const before = run.rounds.slice(0, index).map((r) => r.new_text).join("");
  context.append(el("span", "dl-spec-prompt", run.prompt), el("span", "", before),
                 el("span", "dl-spec-new", frame.new_text));
  body.append(context);

  const q = run.point_mass ? "q = 1（点质量）" : null;
  body.append(el("div", "dl-spec-caption", "draft 的提议 → 目标模型一次前向检验它们，再补一个自己的 token"));
  const row = el("div", "dl-spec-row");
  row.dataset.tokens = frame.drafts.map((d) => d.token).join("|");
  row.dataset.statuses = frame.drafts.map((d) => d.status).join("|");
  for (const draft of frame.drafts) {
    const status = STATUS[draft.status];
    const lines = [`${status.mark} ${status.word}`, q || `q(x) = ${prob(draft.q)}`, `p(x) = ${prob(draft.p)}`];
    if (draft.status !== "unjudged") lines.push(`min(1, p/q) = ${draft.accept_prob.toFixed(2)}`);
    else lines.push("拒绝之后，不检验");
    row.append(chip(`dl-spec-${draft.status}`, draft.token, lines));
  }
  if (!frame.drafts.length) row.append(el("div", "dl-spec-empty", "（没有提议）"));
  const kind = KIND[frame.target.kind];
  const own = chip(`dl-spec-own dl-spec-${frame.target.kind}`, frame.target.token,
                   [`${kind.mark} ${kind.word}`, `${kind.prob} = ${prob(frame.target.prob)}`]);
  own.dataset.kind = frame.target.kind;
  row.append(own);
  body.append(row);
  body.append(el("div", "dl-spec-summary", frame.summary));
}

function render({ model, el: root }) {
  const box = el("div", "dl-spec");
  const style = el("style", "", `
    .dl-spec { font-family: sans-serif; font-size: 13px; max-width: 860px; line-height: 1.45; }
    .dl-spec.dl-lecture { font-size: 19px; max-width: 1200px; }
    .dl-spec-title { font-weight: 600; }
    .dl-spec-controls { display: flex; flex-wrap: wrap; gap: 6px 10px; align-items: center; margin: 4px 0 6px; }
    .dl-spec-controls button, .dl-spec-controls select { font-size: inherit; padding: 2px 10px; }
    .dl-spec-controls input[type=range] { flex: 1 1 8em; min-width: 6em; max-width: 20em; }
    .dl-spec-head { font-weight: 600; margin: 4px 0 2px; }
    .dl-spec-stats { color: #333; }
    .dl-spec-caption { color: #666; margin: 8px 0 3px; }
    .dl-spec-context { border: 1px solid #ccc; border-radius: 3px; padding: 4px 6px; background: #fafafa;
                       overflow-wrap: anywhere; word-break: break-all; font-size: 1.1em; }
    .dl-spec-prompt { color: #777; }
    .dl-spec-new { text-decoration: underline; text-decoration-thickness: 2px; text-underline-offset: 3px;
                   background: #fff3bf; }
    .dl-spec-row { display: flex; flex-wrap: wrap; gap: 6px; align-items: stretch; }
    .dl-spec-chip { border: 2px solid; border-radius: 4px; padding: 2px 6px; min-width: 7.2em; max-width: 100%;
                    box-sizing: border-box; }
    .dl-spec-token { font-size: 1.6em; font-weight: 600; line-height: 1.3; overflow-wrap: anywhere; }
    .dl-spec-line { font-size: 0.92em; white-space: nowrap; }
    .dl-spec-accepted { border-color: #1a7f37; background: #dafbe1; color: #0f5323; }
    .dl-spec-rejected { border-color: #cf222e; background: #ffebe9; color: #82071e; }
    .dl-spec-unjudged { border-color: #aaa; border-style: dashed; background: #f4f4f4; color: #777; }
    /* A drawn line, not text-decoration: Chromium skips line-through with some CJK fonts. */
    .dl-spec-rejected .dl-spec-token, .dl-spec-unjudged .dl-spec-token { position: relative; display: inline-block;
                                                                         padding: 0 2px; }
    .dl-spec-rejected .dl-spec-token::after, .dl-spec-unjudged .dl-spec-token::after {
      content: ""; position: absolute; left: 0; right: 0; top: 52%; border-top: 2px solid currentColor; }
    .dl-spec-unjudged .dl-spec-token::after { border-top-width: 1px; }
    .dl-spec-own { border-color: #0550ae; background: #ddf4ff; color: #0a3069; }
    .dl-spec-empty { align-self: center; color: #777; }
    .dl-spec-summary { margin-top: 6px; }
    .dl-spec-legend { margin-top: 8px; color: #555; font-size: 0.92em; }
  `);
  const choices = el("div", "dl-spec-controls");
  const draftSelect = el("select", "dl-spec-draft");
  draftSelect.setAttribute("aria-label", "draft");
  const gammaSelect = el("select", "dl-spec-gamma");
  gammaSelect.setAttribute("aria-label", "γ");
  const runs = model.get("runs");
  for (const name of [...new Set(runs.map((run) => run.draft))]) {
    const option = el("option", "", name);
    option.value = name;
    draftSelect.append(option);
  }
  for (const gamma of [...new Set(runs.map((run) => run.gamma))].sort((a, b) => a - b)) {
    const option = el("option", "", String(gamma));
    option.value = String(gamma);
    gammaSelect.append(option);
  }
  choices.append(el("label", "", "draft："), draftSelect, el("label", "", "γ："), gammaSelect);
  const controls = el("div", "dl-spec-controls");
  const prev = el("button", "dl-spec-prev", "◀ 上一轮");
  const next = el("button", "dl-spec-next", "下一轮 ▶");
  const slider = el("input", "dl-spec-slider");
  slider.type = "range";
  slider.min = "0";
  slider.setAttribute("aria-label", "轮");
  const label = el("span", "dl-spec-label");
  controls.append(prev, next, slider, label);
  const body = el("div", "dl-spec-body");
  const legend = el("div", "dl-spec-legend",
    "✓ 绿 = 接受 · ✗ 红、删除线 = 拒绝 · – 灰、虚线 = 拒绝之后的提议，作废不检验 · " +
    "↻ / ★ / ● 蓝 = 目标模型自己的 token（拒绝后从残差 r 重抽 / 全部接受后的 bonus / 没有提议时直接抽）");
  box.append(style, el("div", "dl-spec-title", model.get("title")), choices, controls, body, legend);
  root.append(box);

  const redraw = () => {
    const run = currentRun(model);
    const index = Math.max(0, Math.min(model.get("index"), run.rounds.length - 1));
    box.classList.toggle("dl-lecture", model.get("lecture"));
    draftSelect.value = run.draft;
    gammaSelect.value = String(run.gamma);
    slider.max = String(run.rounds.length - 1);
    slider.value = String(index);
    label.textContent = `第 ${index + 1} / ${run.rounds.length} 轮`;
    prev.disabled = index === 0;
    next.disabled = index === run.rounds.length - 1;
    drawFrame(body, run, index);
  };
  const go = (index) => { model.set("index", index); model.save_changes(); redraw(); };
  // A new draft or gamma is a new run: start it from its first round.
  const choose = () => {
    model.set("draft", draftSelect.value);
    model.set("gamma", parseInt(gammaSelect.value, 10));
    go(0);
  };
  draftSelect.addEventListener("change", choose);
  gammaSelect.addEventListener("change", choose);
  prev.addEventListener("click", () => go(Math.max(0, model.get("index") - 1)));
  next.addEventListener("click", () => go(Math.min(currentRun(model).rounds.length - 1, model.get("index") + 1)));
  slider.addEventListener("input", () => go(parseInt(slider.value, 10)));
  return follow(model, ["runs", "draft", "gamma", "index", "lecture", "title"], redraw);
}

export default { render };
