/*
 * A table wider than its box scrolls inside it (a changelist or a console table on a
 * phone; ops/static/ops/console.css), and nothing showed that it did: at 390 px the
 * processes' heartbeat, the schedules' next run and an error group's message were out of
 * view with no sign of them (issue 36.8). Every such box on an admin page now gets:
 *
 * - a line above it naming the columns out of view, "Scroll → for: heartbeat at, stopped
 *   at, current", and, once scrolled, "← role, host" for those passed;
 * - a shadow on each edge that has more beyond it;
 * - keyboard focus (tabindex), so arrow keys scroll it.
 *
 * All follow the scroll, the window's width and the table's content (the health page
 * replaces its figures in place), and disappear when the table fits, as it does at 1366 px.
 * Without JavaScript the table still scrolls; only the signs are missing.
 */
(function () {
  "use strict";

  var BOXES = "#content .results, #content .table-box";

  function columns(table) {
    var head = table.tHead && table.tHead.rows[0];
    if (!head) return [];
    return Array.prototype.map.call(head.cells, function (cell) {
      // The words as written (textContent: innerText would give the CSS upper case).
      var text = cell.querySelector(".text") || cell;
      return { cell: cell, name: (text.textContent || "").replace(/\s+/g, " ").trim() };
    });
  }

  // Names of the columns less than half in view, to the left and to the right of the box.
  function outOfView(box, table) {
    var view = box.getBoundingClientRect();
    var found = { left: [], right: [] };
    columns(table).forEach(function (column) {
      if (!column.name) return; // the checkbox column
      var r = column.cell.getBoundingClientRect();
      var middle = r.left + r.width / 2;
      if (middle > view.right) found.right.push(column.name);
      else if (middle < view.left) found.left.push(column.name);
    });
    return found;
  }

  function update(box, frame, hint, table) {
    var wide = box.scrollWidth > box.clientWidth + 1;
    frame.classList.toggle("scrolls", wide);
    frame.classList.toggle("more-left", wide && box.scrollLeft > 1);
    frame.classList.toggle("more-right", wide && box.scrollLeft + box.clientWidth < box.scrollWidth - 1);
    hint.hidden = !wide;
    if (!wide) {
      box.removeAttribute("tabindex");
      return;
    }
    box.setAttribute("tabindex", "0");
    var away = outOfView(box, table);
    var parts = [];
    if (away.left.length) parts.push("← " + away.left.join(", "));
    if (away.right.length) parts.push("Scroll → for: " + away.right.join(", "));
    else if (frame.classList.contains("more-right")) parts.push("Scroll → for more");
    hint.textContent = parts.join(" · ") || "Scroll sideways for more";
  }

  function setUp(box) {
    var table = box.querySelector("table");
    if (!table || box.dataset.scrollHint) return;
    box.dataset.scrollHint = "on";
    var hint = document.createElement("p");
    hint.className = "scroll-hint";
    hint.hidden = true;
    var frame = document.createElement("div");
    frame.className = "scroll-frame";
    box.parentNode.insertBefore(hint, box);
    box.parentNode.insertBefore(frame, box);
    frame.appendChild(box);
    var pending = false;
    function later() {
      if (pending) return;
      pending = true;
      window.requestAnimationFrame(function () {
        pending = false;
        update(box, frame, hint, table);
      });
    }
    box.addEventListener("scroll", later, { passive: true });
    if (window.ResizeObserver) {
      var watch = new ResizeObserver(later);
      watch.observe(box);
      watch.observe(table);
    } else {
      window.addEventListener("resize", later);
    }
    update(box, frame, hint, table);
  }

  function setUpAll() {
    document.querySelectorAll(BOXES).forEach(setUp);
  }

  function start() {
    setUpAll();
    var content = document.getElementById("content");
    if (content && window.MutationObserver) {
      new MutationObserver(setUpAll).observe(content, { childList: true, subtree: true });
    }
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
