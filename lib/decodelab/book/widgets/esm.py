"""JavaScript shared by the widgets' inline ESM views.

Each widget's `_esm` must stay one self-contained module (the static book runs it from the saved widget state, with
no imports), so the shared helpers are prepended as text: `_ESM = ESM_PRELUDE + <the widget's own view>`.
"""

ESM_PRELUDE = r"""
function el(tag, className, text) {
  const node = document.createElement(tag);
  // JupyterLab binds the arrow keys to notebook navigation; this lets sliders and buttons keep them.
  if (tag === "input" || tag === "button" || tag === "select") node.dataset.lmSuppressShortcuts = "true";
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

// Redraw now and whenever one of the model's `names` changes; returns render()'s cleanup.
function follow(model, names, redraw) {
  for (const name of names) model.on(`change:${name}`, redraw);
  redraw();
  return () => { for (const name of names) model.off(`change:${name}`, redraw); };
}
"""
