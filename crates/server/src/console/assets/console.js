// onceprint console: the little script that makes the printers and the attention list
// live. It listens to the page's server-sent events and, on a change, fetches the page's
// own content again and swaps it in; everything else works without it.
"use strict";
(function () {
  var main = document.getElementById("main");
  if (!main || !main.dataset.live || !window.EventSource) return;
  var state = document.getElementById("live-state");
  var cue = document.getElementById("cue");
  var pending = false;

  function doubtIds() {
    var ids = {};
    main.querySelectorAll('[data-state="in_doubt"][data-task]').forEach(function (el) { ids[el.dataset.task] = true; });
    return ids;
  }

  // A person typing a reason or with an action open must not lose it to a refresh; the
  // refresh waits until they are done.
  function busy() {
    var a = document.activeElement;
    var typing = a && main.contains(a) && /^(INPUT|SELECT|TEXTAREA)$/.test(a.tagName);
    return typing || main.querySelector("details[open]") !== null;
  }

  function beep() {
    try {
      var Ctx = window.AudioContext || window.webkitAudioContext;
      var ctx = new Ctx();
      var o = ctx.createOscillator();
      o.frequency.value = 880;
      o.connect(ctx.destination);
      o.start();
      o.stop(ctx.currentTime + 0.25);
    } catch (e) { /* no sound without a user gesture: the visual cue remains */ }
  }

  function showCue() {
    cue.textContent = main.dataset.cue;
    cue.hidden = false;
    beep();
    setTimeout(function () { cue.hidden = true; }, 8000);
  }

  // The badge on "Needs attention" sits outside the swapped content; each refresh says
  // the count in a header.
  function setCount(n) {
    var badge = document.getElementById("attention-count");
    if (!badge || n === null) return;
    var k = parseInt(n, 10);
    if (isNaN(k)) return;
    badge.textContent = k > 99 ? "99+" : String(k);
    badge.hidden = k === 0;
  }

  function refresh() {
    if (busy()) { pending = true; return; }
    pending = false;
    var before = doubtIds();
    fetch(location.href, { headers: { "X-Console-Fragment": "1" }, credentials: "same-origin", redirect: "manual" })
      .then(function (r) {
        if (r.type === "opaqueredirect" || r.status === 303 || r.redirected) { location.reload(); return null; }
        if (r.ok) { setCount(r.headers.get("X-Console-Attention")); }
        return r.ok ? r.text() : null;
      })
      .then(function (html) {
        if (html === null || html === undefined) return;
        main.innerHTML = html;
        main.dataset.refreshed = String(Date.now());
        var after = doubtIds();
        for (var id in after) { if (!before[id]) { showCue(); break; } }
      })
      .catch(function () { /* the next change tries again */ });
  }

  document.addEventListener("focusout", function () { if (pending) setTimeout(refresh, 50); });
  document.addEventListener("toggle", function () { if (pending) setTimeout(refresh, 50); }, true);

  // The stream is open only while the page is shown. A page kept in the browser's
  // back/forward cache would otherwise keep its connection, and over HTTP/1.1 a browser
  // has six per host: after a few page changes no page and no form could load any more.
  // So the stream closes when the page is hidden and opens again (with a refresh, as the
  // page may be stale) when the page comes back from the cache.
  var es = null;

  function openStream() {
    if (es) return;
    es = new EventSource(main.dataset.live);
    es.addEventListener("hello", function () { state.textContent = main.dataset.liveOn; });
    es.addEventListener("change", refresh);
    es.addEventListener("expired", function () { closeStream(); location.reload(); });
    es.onerror = function () { state.textContent = main.dataset.liveOff; };
  }

  function closeStream() {
    if (!es) return;
    es.close();
    es = null;
  }

  window.addEventListener("pagehide", closeStream);
  window.addEventListener("pageshow", function (ev) {
    if (ev.persisted) { openStream(); refresh(); }
  });
  openStream();
})();
