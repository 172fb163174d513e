// Loaded by myst-nb on pages that store widget state, before embed-amd.js (book/offline_assets.py), with the
// local files and with the CDN fallback alike.
(() => {
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
