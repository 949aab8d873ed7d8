// Live updates: the server says "change" (server-sent events, fed by the domain events); the
// page is fetched again and each [data-live-region] is swapped for its new version. A region
// holding the focused field is kept while its data-live-key (what it shows) is the same, so
// typing is never lost. A change's data is {"marker", "event_type", "workflow_id"} (null type:
// the server's poll saw it); it is passed on as the "vibey:change" event's detail. Every
// change refreshes the page: one message may stand for several events (the newest is named).
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
    document.body.dataset.marker = next.body.dataset.marker || marker;
    document.dispatchEvent(new CustomEvent("vibey:updated"));
  }

  // An answer form is sent in the background: the page is not reloaded. (Without this
  // script the same form posts and the server redirects back: it works either way.)
  document.addEventListener("submit", function (e) {
    var form = e.target;
    if (!form.classList || !form.classList.contains("answer")) return;
    e.preventDefault();
    var body = new FormData(form);
    if (e.submitter && e.submitter.name) body.append(e.submitter.name, e.submitter.value);
    form.querySelectorAll("button").forEach(function (b) { b.disabled = true; });
    fetch(form.action, { method: "POST", body: body, credentials: "same-origin" })
      .then(function (r) { return r.text().then(function (t) { return [r, t]; }); })
      .then(function (rt) {
        if (!rt[0].ok) throw new Error(rt[1]);
        if (document.activeElement) document.activeElement.blur();
        swap(rt[1]);
      })
      .catch(function (err) {
        var flash = document.getElementById("flash");
        if (flash) flash.innerHTML = '<p class="flash error" role="alert"></p>';
        if (flash) flash.firstChild.textContent = String(err.message || err);
        form.querySelectorAll("button").forEach(function (b) { b.disabled = false; });
      });
  });

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
    var change;
    try { change = JSON.parse(e.data); } catch (_) { change = { marker: e.data }; }
    if (!change || change.marker === marker) return;
    marker = change.marker;
    document.dispatchEvent(new CustomEvent("vibey:change", { detail: change }));
    refresh();
  });
})();
