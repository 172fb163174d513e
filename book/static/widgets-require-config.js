// Loaded by myst-nb after require.js, before embed-amd.js, on pages that store widget state (book/offline_assets.py).
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
})();
