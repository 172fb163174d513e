"""Number every display equation of the book, as `math_number_all` does for Sphinx's own `math` directive.

MyST's `$$ … $$` blocks get a number only when they carry a label (`$$ … $$ (label)`), and `math_number_all` does
not reach them: Sphinx applies it inside its `math` directive, which MyST does not use. This transform gives each
unlabelled display equation an automatic label, as that directive would, so that with `numfig` every equation is
numbered by chapter, (3.1), (3.2), like the figures and exercises. Labelled equations keep their labels (and `{eq}`
references to them work as before). Math printed by a notebook cell (a `text/latex` output) is left alone.
"""
from __future__ import annotations

from typing import Any

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.transforms import SphinxTransform


def in_cell_output(node: nodes.Node) -> bool:
    """True when `node` sits inside a notebook cell's output (myst-nb's `cell_output` container)."""
    parent = node.parent
    while parent is not None:
        if isinstance(parent, nodes.Element) and "cell_output" in parent.get("classes", []):
            return True
        parent = parent.parent
    return False


class NumberEveryEquation(SphinxTransform):
    """Give each unlabelled display equation a label `<docname>:<n>`, register it and number it."""

    default_priority = 200  # a reading transform; the equation numbers are assigned after reading, from the ids

    def apply(self, **kwargs: Any) -> None:
        if not self.config.math_number_all:
            return
        domain = self.env.get_domain("math")
        docname = self.env.docname
        for node in self.document.findall(nodes.math_block):
            if node.get("label") or in_cell_output(node):
                continue
            label = f"{docname}:{self.env.new_serialno('sphinx.ext.math#equations')}"
            node["label"] = label
            node["docname"] = docname
            domain.note_equation(docname, label, location=node)
            node["number"] = domain.get_equation_number_for(label)
            node_id = nodes.make_id(f"equation-{label}")
            node["ids"].append(node_id)
            self.document.ids[node_id] = node


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_transform(NumberEveryEquation)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
