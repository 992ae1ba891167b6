/*
 * Worker health page (ops/templates/ops/worker_health.html): reload the figures in place
 * every N seconds (N = data-seconds of #health-refresh; 0 = never), and wait while a person
 * is reading or doing something on the page, so nothing moves under their eyes or cursor:
 * text selected, focus in a field (the admin's sidebar filter too) or anywhere inside the
 * figures (a link reached with the keyboard), a
 * <details> section open, the pointer over a chart, a table or the tiles, or the tab hidden.
 *
 * It fetches the same address (range and refresh kept), takes #content-main from the answer
 * and puts it in place of the current one: no full reload, the scroll position stays. A
 * redirect (the session ended: the login page) stops it; a failed fetch is retried at the
 * next interval. Without JavaScript the page is a plain page: reload it by hand.
 *
 * <html data-health-refreshes> counts the refreshes done and data-health-paused-checks the
 * checks that found a person busy (the browser tests read them).
 */
(function () {
  "use strict";

  var RECHECK_MS = 500; // while paused, how often to look again
  var root = document.documentElement;
  var timer = null;
  var refreshes = 0;
  var pausedChecks = 0;

  function content() {
    return document.getElementById("content-main");
  }

  function status() {
    return document.getElementById("health-refresh");
  }

  function intervalMs() {
    var el = status();
    var seconds = el ? parseInt(el.getAttribute("data-seconds"), 10) : 0;
    return seconds > 0 ? seconds * 1000 : 0;
  }

  function show(state, words) {
    var el = status();
    if (!el) return;
    el.setAttribute("data-state", state);
    var slot = el.querySelector(".state");
    if (slot) slot.textContent = words;
  }

  /* Why the person looks busy ("" when idle). */
  function busy() {
    var main = content();
    if (!main) return "gone";
    if (document.hidden) return "hidden";
    var selection = window.getSelection && window.getSelection();
    if (selection && !selection.isCollapsed && selection.toString().trim() !== "") {
      return "selection";
    }
    var active = document.activeElement;
    if (active && active.matches("input, select, textarea, [contenteditable]")) return "typing";
    if (active && active !== document.body && main.contains(active)) return "focus";
    if (main.querySelector("details[open]")) return "details";
    if (main.querySelector(".health-chart:hover, table:hover, .tiles:hover")) return "hover";
    return "";
  }

  function schedule(ms) {
    if (timer !== null) window.clearTimeout(timer);
    timer = window.setTimeout(tick, ms);
  }

  function tick() {
    timer = null;
    var every = intervalMs();
    if (!every) return;
    var why = busy();
    if (why) {
      pausedChecks += 1;
      root.setAttribute("data-health-paused-checks", String(pausedChecks));
      show("paused", " Paused while you read (" + why + ").");
      schedule(RECHECK_MS);
      return;
    }
    show("loading", "");
    window
      .fetch(window.location.href, {
        credentials: "same-origin",
        cache: "no-store",
        headers: { Accept: "text/html" },
      })
      .then(function (response) {
        if (response.redirected || !response.ok) {
          var stop = new Error("HTTP " + response.status);
          stop.fatal = response.redirected || response.status === 403;
          throw stop;
        }
        return response.text();
      })
      .then(function (html) {
        var fresh = new DOMParser()
          .parseFromString(html, "text/html")
          .getElementById("content-main");
        if (!fresh) throw new Error("no #content-main in the answer");
        var why = busy();
        if (why) {
          // The person started something while the answer travelled: keep what they see.
          schedule(RECHECK_MS);
          return;
        }
        content().replaceWith(document.adoptNode(fresh));
        refreshes += 1;
        root.setAttribute("data-health-refreshes", String(refreshes));
        show("idle", "");
        schedule(intervalMs());
      })
      .catch(function (error) {
        if (error.fatal) {
          show("stopped", " Stopped: reload the page (you may need to log in again).");
          return;
        }
        show("failed", " Last refresh failed (" + error.message + "); trying again.");
        schedule(every);
      });
  }

  function start() {
    var every = intervalMs();
    if (every) {
      show("idle", "");
      schedule(every);
    }
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
