"""A note for widgets that compute in the kernel: it says so wherever no kernel answers, and disappears where one does.

The strategy playground and the autoregressive stepper run the model on every change, so in the static HTML book
(and wherever else a saved notebook's widget state is drawn without its kernel) their controls would move and nothing
would happen. (JupyterLab 4 draws no saved widget state: a notebook opened there without running it shows the
widget's text repr.) `KernelNote` prevents that look:

- it starts with the controls it guards disabled and with its text visible, and that is what a saved notebook
  stores, so every page that draws the stored widget state shows the stored result, greyed-out controls and the note;
- its view (a small anywidget ESM) asks the kernel once, with a custom message, whether the widget is alive there.
  Only a kernel that holds this widget answers: it enables the controls and tells the view to hide the note.
  Without a kernel the message goes nowhere (the static page's widget manager has no comm), so nothing changes.

The answer is a message, not a synced trait, so a notebook saved after a live session still stores the note.

Used by the widgets of chapters/03-strategies.ipynb and chapters/04-autoregressive.ipynb.
"""
from __future__ import annotations

from collections.abc import Sequence

import anywidget
import ipywidgets as widgets
import traitlets

_ESM = r"""
function render({ model, el }) {
  const note = document.createElement("div");
  note.className = "dl-kernel-note";
  note.setAttribute("role", "note");
  note.textContent = model.get("text");
  Object.assign(note.style, {
    background: "#fff7e6", border: "1px solid #f0b429", borderLeft: "5px solid #f0b429", borderRadius: "4px",
    color: "#5c3c00", padding: "6px 10px", margin: "0 0 8px 0", fontSize: "14px", lineHeight: "1.5",
  });
  el.appendChild(note);
  const onMessage = (message) => {
    if (message && message.type === "live") note.remove();
  };
  model.on("msg:custom", onMessage);
  model.send({ type: "ping" });  // a no-op where the widget has no kernel behind it
  return () => model.off("msg:custom", onMessage);
}
export default { render };
"""


class KernelNote(anywidget.AnyWidget):
    """Shows `text` and keeps `controls` disabled until a kernel answers the view's ping (see the module docstring).

    >>> note = KernelNote("需要运行中的 Python 内核", [widgets.IntSlider()])
    >>> note.controls[0].disabled
    True
    """

    _esm = _ESM
    text = traitlets.Unicode("").tag(sync=True)

    def __init__(self, text: str, controls: Sequence[widgets.DOMWidget]) -> None:
        if not isinstance(text, str) or not text:
            raise ValueError(f"text must be a non-empty str, got {text!r}")
        if (isinstance(controls, (str, bytes)) or not isinstance(controls, Sequence)
                or not all(isinstance(control, widgets.DOMWidget) for control in controls)):
            raise TypeError(f"controls must be a list of ipywidgets controls, got {controls!r:.100}")
        super().__init__(text=text)
        self.controls = tuple(controls)
        for control in self.controls:
            control.disabled = True
        self.on_msg(self._on_message)

    def _on_message(self, _widget, content, _buffers) -> None:
        if isinstance(content, dict) and content.get("type") == "ping":
            for control in self.controls:
                control.disabled = False
            self.send({"type": "live"})

    def __repr__(self) -> str:
        return f"KernelNote(text={self.text!r}, controls={len(self.controls)})"
