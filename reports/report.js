// Draw every embedded figure into its <div>; the shared template is applied once here, not stored per figure.
// window.kvReport.ready resolves when all figures are drawn (used by the screenshot and the browser test).
(function () {
  "use strict";
  var template = JSON.parse(document.getElementById("kv-template").textContent);
  var figures = JSON.parse(document.getElementById("kv-figures").textContent);
  var config = { responsive: true, displaylogo: false };
  var GRID_HEIGHT_PX = 250;  // a figure beside another (half the page's width) is drawn this high at most
  var jobs = Object.keys(figures).map(function (id) {
    var el = document.getElementById(id);
    if (!el) { return Promise.reject(new Error("report figure without a place: " + id)); }
    var fig = figures[id];
    var layout = fig.layout || {};
    layout.template = template;
    if (el.closest(".kv-grid") && (layout.height || 0) > GRID_HEIGHT_PX) { layout.height = GRID_HEIGHT_PX; }
    return Plotly.newPlot(el, fig.data || [], layout, config);
  });
  window.kvReport = {
    numFigures: jobs.length,
    ready: Promise.all(jobs).then(function () { document.body.setAttribute("data-kv-ready", "1"); })
  };
})();
