// Each verdict and each verifier has a text marker as well as a colour, so the page reads without colour too.
const VERDICT = { true: "✓ 对", false: "✗ 错" };
const VERIFIERS = ["exact", "likelihood", "majority"];
const VERIFIER = {
  exact: { mark: "◆", name: "exact（oracle）", short: "exact" },
  likelihood: { mark: "▲", name: "likelihood（似然）", short: "likelihood" },
  majority: { mark: "●", name: "majority（多数投票）", short: "majority" },
};

function answerText(answer) { return answer === null ? "（无）" : answer; }

// A typographic minus: log-probabilities are all negative.
function signed(x, digits) { return x.toFixed(digits).replace("-", "−"); }

function temperatureText(t) { return `T = ${t}`; }

function currentRun(model) {
  const runs = model.get("runs");
  return runs.find((run) => run.question === model.get("question") && run.temperature === model.get("temperature"))
    || runs[0];
}

// The answers of the first n samples with their counts, most votes first, ties in order of first appearance;
// samples that name nobody are counted apart: they do not vote.
function votes(samples) {
  const counts = new Map();
  let silent = 0;
  for (const sample of samples) {
    if (sample.answer === null) silent += 1;
    else counts.set(sample.answer, (counts.get(sample.answer) || 0) + 1);
  }
  const ranked = [...counts.entries()].sort((a, b) => b[1] - a[1]);
  return { ranked, silent };
}

function why(verifier, run, frame, n) {
  const picked = run.samples[frame.picks[verifier]];
  if (verifier === "exact") {
    return frame.num_right ? "前 n 个里第一个答对的样本（只有评测时才有真值）"
      : "前 n 个里没有答对的，oracle 也只能交出样本 0";
  }
  if (verifier === "likelihood") return `前 n 个里平均 log 概率最高：${signed(picked.mean_logprob, 2)}`;
  const { ranked, silent } = votes(run.samples.slice(0, n));
  if (!ranked.length) return "前 n 个样本都没有提到人，没有票可投，交出样本 0";
  const tally = ranked.map(([answer, count]) => `${answer} ${count} 票`).join(" · ");
  return tally + (silent ? ` · 没提到人的 ${silent} 个不投票` : "") +
    (ranked.length > 1 && ranked[0][1] === ranked[1][1] ? "（平票：取先出现的）" : "");
}

function drawVerifiers(body, run, frame, n) {
  body.append(el("div", "dl-bon-caption", `三个 verifier 各从前 n = ${n} 个样本里挑一个`));
  const list = el("div", "dl-bon-verifiers");
  for (const verifier of VERIFIERS) {
    const index = frame.picks[verifier];
    const sample = run.samples[index];
    const row = el("div", `dl-bon-verifier dl-bon-${sample.correct ? "right" : "wrong"}-text`);
    row.dataset.verifier = verifier;
    row.dataset.pick = String(index);
    row.dataset.correct = String(sample.correct);
    const info = VERIFIER[verifier];
    row.append(el("span", "dl-bon-vname", `${info.mark} ${info.name}`),
               el("span", "dl-bon-vpick", `→ 样本 ${index}：${answerText(sample.answer)}`),
               el("span", "dl-bon-verdict", VERDICT[sample.correct]),
               el("span", "dl-bon-why", why(verifier, run, frame, n)));
    list.append(row);
  }
  body.append(list);
}

function drawPassAtK(body, frame, n) {
  const c = frame.num_right;
  body.append(el("div", "dl-bon-caption",
    `pass@k（k ≤ n）：前 n = ${n} 个样本里 c = ${c} 个对，无偏估计 1 − C(n−c, k) / C(n, k)`));
  const fraction = el("div", "dl-bon-fraction");
  fraction.textContent = `答对的比例 c / n = ${c} / ${n} = ${(c / n).toFixed(3)}（就是 pass@1）` +
    ` · pass@${n} = ${frame.pass_at_k[n - 1].toFixed(3)}（${c ? "至少一个对，= oracle 答对" : "没有一个对"}）`;
  body.append(fraction);
  const strip = el("div", "dl-bon-pass");
  strip.dataset.values = frame.pass_at_k.map((v) => v.toFixed(4)).join("|");
  frame.pass_at_k.forEach((value, i) => {
    const cell = el("div", "dl-bon-pass-cell");
    const bar = el("div", "dl-bon-pass-bar");
    bar.append(el("div", "dl-bon-pass-fill"));
    bar.firstChild.style.height = `${(100 * value).toFixed(1)}%`;
    cell.append(bar, el("div", "dl-bon-pass-k", `k=${i + 1}`), el("div", "dl-bon-pass-value", value.toFixed(3)));
    strip.append(cell);
  });
  body.append(strip);
}

function drawCard(run, index, pickedBy) {
  const sample = run.samples[index];
  const card = el("div", `dl-bon-card dl-bon-${sample.correct ? "right" : "wrong"}`);
  card.dataset.index = String(index);
  card.dataset.answer = sample.answer === null ? "" : sample.answer;
  card.dataset.correct = String(sample.correct);
  card.dataset.picked = pickedBy.join(",");
  if (pickedBy.length) card.classList.add("dl-bon-picked");
  const head = el("div", "dl-bon-card-head");
  head.append(el("span", "dl-bon-card-index", `样本 ${index}`));
  for (const verifier of pickedBy) {
    const info = VERIFIER[verifier];
    head.append(el("span", `dl-bon-badge dl-bon-badge-${verifier}`, `${info.mark} ${info.short} 选中`));
  }
  const answer = el("div", "dl-bon-card-answer");
  answer.append(el("span", "", `回答：${answerText(sample.answer)}`),
                el("span", "dl-bon-verdict", VERDICT[sample.correct]));
  const meta = el("div", "dl-bon-card-meta",
                  `平均 log 概率 ${signed(sample.mean_logprob, 2)} · ${sample.num_tokens} 个 token`);
  const text = el("div", "dl-bon-card-text");
  if (sample.answer_at >= 0) {
    const end = sample.answer_at + sample.answer.length;
    text.append(el("span", "", sample.text.slice(0, sample.answer_at)),
                el("mark", "dl-bon-name", sample.text.slice(sample.answer_at, end)),
                el("span", "", sample.text.slice(end)));
  } else {
    text.textContent = sample.text;
  }
  card.append(head, answer, meta, text);
  return card;
}

function drawFrame(body, run, n) {
  const frame = run.frames[n - 1];
  body.replaceChildren();
  const head = el("div", "dl-bon-head");
  head.dataset.question = run.question;
  head.dataset.temperature = String(run.temperature);
  head.dataset.n = String(n);
  head.append(el("span", "dl-bon-prompt", run.question),
              el("span", "", ` 标准答案：${run.answer} · ${temperatureText(run.temperature)} · ` +
                             `前 ${n} 个样本里 ${frame.num_right} 个答对`));
  body.append(head);
  drawVerifiers(body, run, frame, n);
  drawPassAtK(body, frame, n);
  const cost = el("div", "dl-bon-cost");
  cost.dataset.tokens = String(frame.tokens);
  cost.textContent = `token 成本：${n} 个样本共生成 ${frame.tokens} 个 token（每个最多 ${run.max_tokens} 个）；` +
    `prompt 的 ${run.prompt_tokens} 个 token 只 prefill 一次，${n} 个样本共用它的 KV block。`;
  body.append(cost);
  body.append(el("div", "dl-bon-caption", `前 n = ${n} 个样本（抽样顺序；黄底下划线 = answer_of 找到的第一个人名）`));
  const cards = el("div", "dl-bon-cards");
  for (let i = 0; i < n; i++) {
    cards.append(drawCard(run, i, VERIFIERS.filter((v) => frame.picks[v] === i)));
  }
  body.append(cards);
}

function option(select, value, text) {
  const item = el("option", "", text);
  item.value = value;
  select.append(item);
}

function render({ model, el: root }) {
  const box = el("div", "dl-bon");
  const style = el("style", "", `
    .dl-bon { font-family: sans-serif; font-size: 13px; max-width: 900px; line-height: 1.45; }
    .dl-bon.dl-lecture { font-size: 19px; max-width: 1200px; }
    .dl-bon-title { font-weight: 600; }
    .dl-bon-controls { display: flex; flex-wrap: wrap; gap: 6px 10px; align-items: center; margin: 4px 0 6px; }
    .dl-bon-controls button, .dl-bon-controls select { font-size: inherit; padding: 2px 10px; max-width: 100%; }
    .dl-bon-field { display: inline-flex; align-items: center; gap: 4px; max-width: 100%; }
    .dl-bon-controls input[type=range] { flex: 1 1 8em; min-width: 6em; max-width: 20em; }
    .dl-bon-head { font-weight: 600; margin: 4px 0 2px; overflow-wrap: anywhere; }
    .dl-bon-prompt { background: #f0f0f0; padding: 0 4px; border-radius: 3px; }
    .dl-bon-caption { color: #666; margin: 8px 0 3px; }
    .dl-bon-verifiers { display: flex; flex-direction: column; gap: 3px; }
    .dl-bon-verifier { display: flex; flex-wrap: wrap; gap: 2px 10px; align-items: baseline; padding: 2px 6px;
                       border-left: 4px solid; background: #fafafa; }
    .dl-bon-vname { font-weight: 600; min-width: 11em; }
    .dl-bon-why { color: #555; font-size: 0.92em; overflow-wrap: anywhere; }
    .dl-bon-right-text { border-left-color: #1a7f37; }
    .dl-bon-wrong-text { border-left-color: #cf222e; }
    .dl-bon-right-text .dl-bon-verdict, .dl-bon-right .dl-bon-verdict { color: #0f5323; font-weight: 600; }
    .dl-bon-wrong-text .dl-bon-verdict, .dl-bon-wrong .dl-bon-verdict { color: #82071e; font-weight: 600; }
    .dl-bon-fraction { margin-bottom: 3px; }
    .dl-bon-pass { display: flex; flex-wrap: wrap; gap: 3px; }
    .dl-bon-pass-cell { width: 3.4em; text-align: center; font-size: 0.85em; }
    .dl-bon-pass-bar { height: 2.4em; background: #eee; display: flex; align-items: flex-end; }
    .dl-bon-pass-fill { width: 100%; background: #8250df; }
    .dl-bon-pass-k { color: #555; }
    .dl-bon-cost { margin-top: 8px; padding: 3px 6px; background: #fff8c5; border-radius: 3px; }
    /* The padding keeps a picked card's outer ring inside the widget at the window's edge. */
    .dl-bon-cards { display: grid; gap: 6px; padding: 3px;
                    grid-template-columns: repeat(auto-fill, minmax(min(100%, 15em), 1fr)); }
    .dl-bon-card { border: 2px solid; border-radius: 4px; padding: 3px 6px; box-sizing: border-box; min-width: 0; }
    .dl-bon-right { border-color: #1a7f37; background: #f3fcf5; }
    .dl-bon-wrong { border-color: #cf222e; background: #fff5f4; border-style: dashed; }
    .dl-bon-picked { box-shadow: 0 0 0 3px #0550ae; }
    .dl-bon-card-head { display: flex; flex-wrap: wrap; gap: 3px 6px; align-items: baseline; }
    .dl-bon-card-index { font-weight: 600; margin-right: auto; }
    .dl-bon-badge { font-size: 0.85em; border-radius: 3px; padding: 0 4px; background: #0550ae; color: #fff; }
    .dl-bon-card-answer { display: flex; gap: 8px; font-size: 1.1em; }
    .dl-bon-card-meta { color: #555; font-size: 0.92em; }
    .dl-bon-card-text { color: #333; overflow-wrap: anywhere; word-break: break-all; margin-top: 2px; }
    .dl-bon-name { background: #fff3bf; color: inherit; text-decoration: underline; text-decoration-thickness: 2px;
                   text-underline-offset: 3px; }
    .dl-bon-legend { margin-top: 8px; color: #555; font-size: 0.92em; }
  `);
  const runs = model.get("runs");
  const choices = el("div", "dl-bon-controls");
  const questionSelect = el("select", "dl-bon-question");
  questionSelect.setAttribute("aria-label", "问题");
  for (const question of [...new Set(runs.map((run) => run.question))]) option(questionSelect, question, question);
  const temperatureSelect = el("select", "dl-bon-temperature");
  temperatureSelect.setAttribute("aria-label", "温度");
  for (const t of [...new Set(runs.map((run) => run.temperature))]) option(temperatureSelect, String(t), String(t));
  // A label holds its select, so the two wrap together on a narrow screen.
  const field = (text, select) => {
    const label = el("label", "dl-bon-field", text);
    label.append(select);
    return label;
  };
  choices.append(field("问题：", questionSelect), field("温度 T：", temperatureSelect));
  const controls = el("div", "dl-bon-controls");
  const fewer = el("button", "dl-bon-fewer", "− 1");
  const more = el("button", "dl-bon-more", "+ 1");
  const slider = el("input", "dl-bon-slider");
  slider.type = "range";
  slider.min = "1";
  slider.setAttribute("aria-label", "n");
  const label = el("span", "dl-bon-label");
  controls.append(el("span", "", "样本数 n："), fewer, slider, more, label);
  const body = el("div", "dl-bon-body");
  const legend = el("div", "dl-bon-legend",
    "✓ 绿实线 = 答对（第一个人名是标准答案）· ✗ 红虚线 = 答错或没有提到人 · 蓝框和标签 = verifier 选中的样本：" +
    "◆ exact 看真值，▲ likelihood 看模型自己的平均 log 概率，● majority 看多数回答 · 紫条 = pass@k");
  box.append(style, el("div", "dl-bon-title", model.get("title")), choices, controls, body, legend);
  root.append(box);

  const redraw = () => {
    const run = currentRun(model);
    const size = run.samples.length;
    const n = Math.max(1, Math.min(model.get("n"), size));
    box.classList.toggle("dl-lecture", model.get("lecture"));
    questionSelect.value = run.question;
    temperatureSelect.value = String(run.temperature);
    slider.max = String(size);
    slider.value = String(n);
    label.textContent = `n = ${n} / ${size}`;
    fewer.disabled = n === 1;
    more.disabled = n === size;
    drawFrame(body, run, n);
  };
  const go = (n) => { model.set("n", n); model.save_changes(); redraw(); };
  // Another question or temperature keeps n, so the same n can be compared across them.
  const choose = () => {
    model.set("question", questionSelect.value);
    model.set("temperature", parseFloat(temperatureSelect.value));
    model.save_changes();
    redraw();
  };
  questionSelect.addEventListener("change", choose);
  temperatureSelect.addEventListener("change", choose);
  fewer.addEventListener("click", () => go(Math.max(1, model.get("n") - 1)));
  more.addEventListener("click", () => go(Math.min(currentRun(model).samples.length, model.get("n") + 1)));
  slider.addEventListener("input", () => go(parseInt(slider.value, 10)));
  return follow(model, ["runs", "question", "temperature", "n", "lecture", "title"], redraw);
}

export default { render };
