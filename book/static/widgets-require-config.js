// Loaded by myst-nb between require.js and embed-amd.js on pages that store widget state (book/offline_assets.py).
(() => {
  // Map the widget modules to the copies served with the book, so that the embed manager never falls back to a
  // CDN. embed-amd.js finds its icon fonts next to the paths of its own modules (@jupyter-widgets/base, ...,
  // @jupyter-widgets/html-manager/dist/libembed-amd): all of them point at the folder that holds the fonts.
  const here = document.currentScript.src;
  const staticRoot = here.slice(0, here.lastIndexOf("/") + 1);  // .../_static/
  window.requirejs.config({
    paths: {
      "@jupyter-widgets/html-manager/dist": staticRoot + "widgets",
      "@jupyter-widgets": staticRoot + "widgets",
      anywidget: staticRoot + "anywidget/index",
    },
  });

  // @jupyter-widgets/base typesets widget labels with MathJax 2's MathJax.Hub.Queue; the book loads MathJax 3,
  // which has no Hub ("Cannot read properties of undefined (reading 'Queue')"). Give every object that becomes
  // window.MathJax (Sphinx's config object, then MathJax 3 itself) a Hub that forwards to MathJax 3.
  const hub = {
    Queue: (job) => {
      const element = Array.isArray(job) ? job[2] : undefined;
      const mathjax = window.MathJax;
      if (!element || !mathjax || !mathjax.startup || !mathjax.typesetPromise) return;
      mathjax.startup.promise
        .then(() => mathjax.typesetPromise([element]))
        .catch((error) => console.warn("MathJax could not typeset a widget label:", error));
    },
  };
  const withHub = (value) => {
    if (value && typeof value === "object" && !value.Hub) value.Hub = hub;
    return value;
  };
  let current = withHub(window.MathJax);
  Object.defineProperty(window, "MathJax", {
    configurable: true,
    enumerable: true,
    get: () => current,
    set: (value) => { current = withHub(value); },
  });
})();
