// A click on any bar or point of the dashboard opens the MLflow run that measured it; a shift-click
// (or alt-click) opens that trial's generated texts, served by the dashboard itself (/run/<id>).
// The page says where the MLflow UI is (#mlflow-ui: data-url, and data-run-field, the index of the run
// id in every trace's customdata: dashboard/sections/common.py RUN_ID_FIELD); each section says its
// experiment (data-experiment-id). Graphs appear and are redrawn by Dash, so new ones are found by
// watching the page.
(function () {
  function runUrl(gd, point, texts) {
    const ui = document.getElementById('mlflow-ui');
    const section = gd.closest('[data-experiment-id]');
    const data = point && point.customdata;
    if (!ui || !section || !Array.isArray(data)) return null;
    const runId = data[Number(ui.dataset.runField)];
    if (!runId || runId === 'n/a') return null;
    if (texts) return 'run/' + runId;
    return ui.dataset.url.replace(/\/+$/, '') + '/#/experiments/' + section.dataset.experimentId +
      '/runs/' + runId;
  }
  function attach(gd) {
    // Dash may purge and redraw a graph in the same element (which drops its listeners), so the
    // listener is (re)registered on every pass, once: removed first, then added.
    if (typeof gd.on !== 'function' || typeof gd.removeListener !== 'function') return;
    if (!gd.__openRun) {
      gd.__openRun = function (event) {
        const texts = !!(event && event.event && (event.event.shiftKey || event.event.altKey));
        const url = event && event.points && event.points.length ? runUrl(gd, event.points[0], texts) : null;
        if (url) window.open(url, '_blank', 'noopener');
      };
    }
    gd.removeListener('plotly_click', gd.__openRun);
    gd.on('plotly_click', gd.__openRun);
  }
  function watch() {
    new MutationObserver(function () {
      document.querySelectorAll('.js-plotly-plot').forEach(attach);
    }).observe(document.body, {childList: true, subtree: true, attributes: true, attributeFilter: ['class']});
    document.querySelectorAll('.js-plotly-plot').forEach(attach);
  }
  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', watch);
  else watch();
})();
