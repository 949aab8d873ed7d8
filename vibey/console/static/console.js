// Live updates: the server says "change" (server-sent events); the page is fetched again and
// each [data-live-region] is swapped for its new version. A region holding the focused field
// is kept while its data-live-key (what it shows) is the same, so typing is never lost.
(function () {
  "use strict";
  if (document.body.dataset.live !== "on" || !window.EventSource) return;
  var state = document.getElementById("live-state");
  var marker = document.body.dataset.marker || "";
  var busy = false, again = false;

  function swap(html) {
    var next = new DOMParser().parseFromString(html, "text/html");
    document.querySelectorAll("[data-live-region]").forEach(function (old) {
      var fresh = next.getElementById(old.id);
      if (!fresh) return;
      var focused = old.contains(document.activeElement) && document.activeElement !== document.body;
      if (focused && fresh.dataset.liveKey === old.dataset.liveKey) return;
      if (fresh.innerHTML !== old.innerHTML) old.replaceWith(fresh);
    });
    var flash = next.querySelector(".flash");
    document.body.dataset.marker = next.body.dataset.marker || marker;
    document.dispatchEvent(new CustomEvent("vibey:updated", { detail: { flash: !!flash } }));
  }

  function refresh() {
    if (busy) { again = true; return; }
    busy = true;
    fetch(location.href, { headers: { "X-Vibey-Live": "1" }, credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
      .then(swap)
      .catch(function () { state.classList.add("off"); })
      .finally(function () { busy = false; if (again) { again = false; refresh(); } });
  }

  var source = new EventSource("/events?seen=" + encodeURIComponent(marker));
  source.addEventListener("open", function () { state.classList.remove("off"); });
  source.addEventListener("error", function () { state.classList.add("off"); });
  source.addEventListener("change", function (e) {
    if (e.data === marker) return;
    marker = e.data;
    refresh();
  });
})();
