// The softmax explorer's view. No imports, no network: it runs live in JupyterLab and, from the saved widget state,
// in the static HTML book. softmaxState mirrors decodelab.book.widgets.softmax_explorer.softmax_state.

export function softmaxState(logits, shift) {
  const shifted = logits.map((x) => x + shift);
  const rowMax = Math.max(...shifted);
  const exps = shifted.map((x) => Math.exp(x - rowMax));
  const total = exps.reduce((a, b) => a + b, 0);
  const logSumExp = rowMax + Math.log(total);
  return { logits: shifted, probs: exps.map((x) => x / total), log_probs: shifted.map((x) => x - logSumExp),
           log_sum_exp: logSumExp };
}

const LOG_FLOOR = -12;  // the log-softmax bars run from 0 (right edge) down to this many nats

function rangeInput(min, max, step, value, label) {
  const input = el("input");
  Object.assign(input, { type: "range", min: String(min), max: String(max), step: String(step), value: String(value) });
  input.setAttribute("aria-label", label);
  return input;
}

function render({ model, el: root }) {
  const box = el("div", "dl-softmax");
  box.append(el("style", "", `
    .dl-softmax { font-family: "Noto Sans SC", "Noto Sans CJK SC", "WenQuanYi Micro Hei", sans-serif; font-size: 14px;
      color: #222; background: #fff; border: 1px solid #ddd; border-radius: 6px; padding: 0.5em; max-width: 56em; }
    .dl-softmax.dl-lecture { font-size: 21px; max-width: none; line-height: 1.2; }
    .dl-softmax-head, .dl-softmax-row { display: grid; align-items: center; gap: 0.2em 0.6em;
      grid-template-columns: 1.6em minmax(6em, 1.2fr) 3.2em minmax(4em, 1fr) 3.6em minmax(4em, 1fr) 4em; }
    .dl-softmax-head { font-size: 0.85em; color: #555; margin-bottom: 0.2em; }
    .dl-softmax-row { margin: 0.15em 0; }
    .dl-softmax-token { font-size: 1.15em; text-align: center; }
    .dl-softmax input[type="range"] { width: 100%; margin: 0; }
    .dl-softmax-track { height: 1em; background: #f1f1f1; position: relative; }
    .dl-softmax-prob { height: 100%; background: #2f6db5; }
    .dl-softmax-log { height: 100%; background: #e08a3c; position: absolute; right: 0; top: 0; }
    .dl-softmax-num { font-variant-numeric: tabular-nums; text-align: right; white-space: nowrap; }
    .dl-softmax-shift { display: flex; align-items: center; gap: 0.6em; margin-top: 0.5em; flex-wrap: wrap; }
    .dl-softmax-shift input[type="range"] { width: 12em; }
    .dl-softmax-sum { margin-top: 0.4em; color: #444; }
    @media (max-width: 560px) {
      .dl-softmax { padding: 0.3em; }
      .dl-softmax-head, .dl-softmax-row { gap: 0.2em 0.35em;
        grid-template-columns: 1.3em minmax(4em, 1.3fr) minmax(2.5em, 1fr) 2.9em minmax(2.5em, 1fr) 3.2em; }
      .dl-softmax-head > :nth-child(3), .dl-softmax-row > :nth-child(3) { display: none; }
    }
  `));
  const tokens = model.get("tokens");
  const [low, high] = model.get("logit_range"), [shiftLow, shiftHigh] = model.get("shift_range");
  const step = model.get("step");
  const head = el("div", "dl-softmax-head");
  // the first column holds the tokens themselves and needs no heading
  for (const text of ["", "logit z（拖动）", "z", "softmax p", "p", "log-softmax", "log p"]) head.append(el("span", "", text));
  box.append(head);
  const rows = tokens.map((token, i) => {
    const row = el("div", "dl-softmax-row");
    row.dataset.token = token;
    row.dataset.index = String(i);
    const input = rangeInput(low, high, step, model.get("logits")[i], `${token} 的 logit`);
    input.dataset.index = String(i);
    input.addEventListener("input", () => {
      const logits = [...model.get("logits")];
      logits[i] = parseFloat(input.value);
      model.set("logits", logits);
      model.save_changes();
    });
    const probTrack = el("div", "dl-softmax-track"), prob = el("div", "dl-softmax-prob");
    probTrack.append(prob);
    const logTrack = el("div", "dl-softmax-track"), log = el("div", "dl-softmax-log");
    logTrack.append(log);
    const parts = { input, prob, log, z: el("span", "dl-softmax-num dl-softmax-z"), p: el("span", "dl-softmax-num dl-softmax-p"),
                    logp: el("span", "dl-softmax-num dl-softmax-logp") };
    row.append(el("span", "dl-softmax-token", token), input, parts.z, probTrack, parts.p, logTrack, parts.logp);
    box.append(row);
    return { row, ...parts };
  });
  const shiftRow = el("label", "dl-softmax-shift");
  const shiftInput = rangeInput(shiftLow, shiftHigh, step, model.get("shift"), "所有 logits 加同一个常数 c");
  shiftInput.dataset.param = "shift";
  shiftInput.addEventListener("input", () => { model.set("shift", parseFloat(shiftInput.value)); model.save_changes(); });
  const shiftValue = el("span", "dl-softmax-num");
  shiftRow.append(el("span", "", "所有 logits 加同一个常数 c"), shiftInput, shiftValue);
  const sum = el("div", "dl-softmax-sum");
  box.append(shiftRow, sum,
             el("div", "dl-softmax-sum", "蓝条：softmax 概率（整条 = 1）；橙条：log-softmax，从右向左，整条 = −12 nats。"));
  root.append(box);

  const redraw = () => {
    box.classList.toggle("dl-lecture", model.get("lecture"));
    const logits = model.get("logits"), shift = model.get("shift");
    const s = softmaxState(logits, shift);
    rows.forEach((r, i) => {
      if (document.activeElement !== r.input) r.input.value = String(logits[i]);
      r.row.dataset.logit = s.logits[i].toFixed(6);
      r.row.dataset.prob = s.probs[i].toFixed(6);
      r.row.dataset.logProb = s.log_probs[i].toFixed(6);
      r.z.textContent = s.logits[i].toFixed(1);
      r.p.textContent = s.probs[i].toFixed(3);
      r.logp.textContent = s.log_probs[i].toFixed(2);
      r.prob.style.width = `${100 * s.probs[i]}%`;
      r.log.style.width = `${100 * Math.min(1, s.log_probs[i] / LOG_FLOOR)}%`;
    });
    if (document.activeElement !== shiftInput) shiftInput.value = String(shift);
    shiftValue.textContent = `c = ${shift.toFixed(1)}`;
    sum.dataset.logSumExp = s.log_sum_exp.toFixed(6);
    sum.textContent = `max z = ${Math.max(...s.logits).toFixed(1)}，log Σ exp(z) = ${s.log_sum_exp.toFixed(3)}，` +
                      `Σ p = ${s.probs.reduce((a, b) => a + b, 0).toFixed(3)}`;
  };
  return follow(model, ["logits", "shift", "lecture"], redraw);
}

export default { render };
