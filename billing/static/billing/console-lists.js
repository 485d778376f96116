// Console lists: the filter sidebar collapses to a button, so a list gets the whole width at 1366 px
// (docs/decisions.md, Operator console). The choice is kept in this browser for every list.
document.addEventListener("DOMContentLoaded", function () {
  var filter = document.getElementById("changelist-filter");
  var changelist = document.getElementById("changelist");
  if (!filter || !changelist) return;
  var KEY = "tollgate.console.filtersHidden";
  var toggle = document.createElement("button");
  toggle.type = "button";
  toggle.id = "toggle-filters";
  toggle.className = "button";
  var apply = function (hidden) {
    changelist.classList.toggle("filters-hidden", hidden);
    filter.hidden = hidden;
    toggle.textContent = hidden ? "Show filters" : "Hide filters";
    toggle.setAttribute("aria-expanded", hidden ? "false" : "true");
  };
  toggle.addEventListener("click", function () {
    var hidden = !filter.hidden;
    try { window.localStorage.setItem(KEY, hidden ? "1" : "0"); } catch (e) { /* private mode: this page only */ }
    apply(hidden);
  });
  var host = document.getElementById("toolbar") || changelist.querySelector(".changelist-form-container");
  host.insertBefore(toggle, host.firstChild);
  var stored = null;
  try { stored = window.localStorage.getItem(KEY); } catch (e) { stored = null; }
  apply(stored === "1");
});
