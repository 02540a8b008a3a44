/* agentops live updates: one WebSocket per page, fragments applied in seq order.
 *
 * The server sends {type: "event", event: {seq, type, session_id, ...}, html}. The html is a list
 * of <template data-op data-target [data-id] data-seq> instructions (sessions_app/fragments.py).
 * Session pages: apply events strictly in seq order; drop duplicates; on a gap, buffer and ask
 * the server for the missing range. Reconnect with backoff and say the last seq rendered, which
 * the page also shows as [data-live]@data-last-seq. What an event changes arrives with it (the
 * sidebar too, as a "replace #sidebar" op): the page fetches nothing.
 * No inline scripts (CSP script-src 'self'): everything lives in this file.
 */
(function () {
  "use strict";

  function seqOf(el) {
    return parseInt(el.getAttribute("data-seq") || "0", 10) || 0;
  }

  function lastMatch(selector) {
    var all = document.querySelectorAll(selector);
    return all.length ? all[all.length - 1] : null;
  }

  function visibleInQueue(container, el) {
    var checks = [["tool", "data-tool"], ["agent", "data-agent"], ["risk", "data-risk"]];
    for (var i = 0; i < checks.length; i++) {
      var want = container.getAttribute("data-filter-" + checks[i][0]);
      if (want && el.getAttribute(checks[i][1]) !== want) return false;
    }
    var claim = container.getAttribute("data-filter-claim");
    var by = el.getAttribute("data-claimed-by") || "";
    if (claim === "mine" && by !== container.getAttribute("data-me")) return false;
    if (claim === "unassigned" && by) return false;
    return true;
  }

  // A replaced part keeps what the user was typing in it (the sidebar's next input).
  function keepTyping(old, fresh) {
    var fields = old.querySelectorAll("textarea[name], input[type=text][name]");
    for (var i = 0; i < fields.length; i++) {
      if (!fields[i].value) continue;
      var twin = fresh.querySelector(fields[i].tagName.toLowerCase() + '[name="' + fields[i].name + '"]');
      if (!twin) continue;
      twin.value = fields[i].value;
      if (document.activeElement === fields[i]) twin.setAttribute("data-refocus", "");
    }
  }

  function applyOp(tpl) {
    var op = tpl.getAttribute("data-op");
    var target = tpl.getAttribute("data-target");
    var id = tpl.getAttribute("data-id");
    var seq = parseInt(tpl.getAttribute("data-seq") || "0", 10);
    var container = target ? lastMatch(target) : null;
    if (op === "remove") {
      var gone = id && document.getElementById(id);
      if (gone) gone.remove();
      return;
    }
    if (!container) return; // this page does not show that part
    if (op === "append-text") {
      if (seq <= seqOf(container)) return; // already folded into the page
      container.appendChild(document.createTextNode(tpl.content.textContent));
      container.setAttribute("data-seq", String(seq));
      return;
    }
    var fresh = tpl.content.firstElementChild;
    if (!fresh) return;
    fresh = document.importNode(fresh, true);
    if (op === "replace") {
      // A part that says which seq it reflects (the sidebar) never goes back in time.
      if (fresh.hasAttribute("data-seq") && seqOf(container) > seqOf(fresh)) return;
      keepTyping(container, fresh);
      container.replaceWith(fresh);
      activate(fresh);
      var refocus = fresh.querySelector("[data-refocus]");
      if (refocus) { refocus.removeAttribute("data-refocus"); refocus.focus(); }
      return;
    }
    if (op === "upsert") {
      var existing = id && document.getElementById(id);
      if (existing) {
        if (seqOf(existing) > seq) return; // never go back in time
        if (container.id === "approval-queue" && !visibleInQueue(container, fresh)) {
          existing.remove(); // claimed by someone else while "unassigned" is shown, …
          return;
        }
        existing.replaceWith(fresh);
      } else if (container.id === "approval-queue" && !visibleInQueue(container, fresh)) {
        return;
      } else if (container.getAttribute("data-order") === "newest") {
        container.prepend(fresh);
      } else if (container.querySelector("#queue-more")) {
        return; // oldest first and not all loaded: it comes with the last page, in its place
      } else {
        container.appendChild(fresh);
      }
      activate(fresh);
    }
  }

  // A part pushed live is the same for every viewer: what only one of them may do (release the
  // request they claimed) is shown to that one.
  function showMine(el) {
    var me = document.body.getAttribute("data-me") || "";
    var mine = el.querySelectorAll ? el.querySelectorAll("[data-claimer]") : [];
    for (var i = 0; i < mine.length; i++) mine[i].hidden = !me || mine[i].getAttribute("data-claimer") !== me;
  }

  function activate(el) {
    showMine(el);
    if (window.htmx) window.htmx.process(el);
    showPresence();
    var empty = document.getElementById("timeline-empty");
    if (empty && el.classList && el.classList.contains("turn")) empty.remove();
    var none = document.getElementById("artifacts-none");  // the first artifact, live
    if (none && el.parentNode && el.parentNode.id === "artifacts") none.remove();
  }

  function applyHtml(html) {
    var holder = document.createElement("template");
    holder.innerHTML = html || "";
    var ops = holder.content.querySelectorAll("template[data-op]");
    for (var i = 0; i < ops.length; i++) applyOp(ops[i]);
  }

  // Bounds for a page left open for days: out-of-order messages buffered at most (the rest are
  // asked for again), and approval events remembered as applied.
  var MAX_PENDING = 500;
  var MAX_SEEN = 2000;

  function setState(state, label) {
    var el = document.getElementById("live-state");
    if (!el) return;
    el.setAttribute("data-state", state);
    el.textContent = label;
  }

  function connect(root) {
    var kind = root.getAttribute("data-live");
    var path = root.getAttribute("data-ws");
    var lastSeq = parseInt(root.getAttribute("data-last-seq") || "0", 10);
    var since = root.getAttribute("data-since") || "";
    var pending = {}; // seq -> message, waiting for the gap before it to be filled
    var pendingCount = 0;
    var highest = lastSeq; // the highest seq announced: everything up to it must be shown
    var seen = {}; // approvals page: session:seq already applied
    var seenOrder = []; // the same keys, oldest first, to forget the oldest
    var gapAsked = 0;
    var socket = null;
    var retry = 0;

    function applySession(msg) {
      var seq = msg.event.seq;
      if (seq <= lastSeq) return;
      if (seq > highest) highest = seq;
      if (!pending[seq] && (pendingCount < MAX_PENDING || seq === lastSeq + 1)) {
        pending[seq] = msg; // a message over the bound is dropped here and asked for again
        pendingCount += 1;
      }
      while (pending[lastSeq + 1]) {
        var next = pending[lastSeq + 1];
        delete pending[lastSeq + 1];
        pendingCount -= 1;
        lastSeq += 1;
        applyHtml(next.html);
      }
      root.setAttribute("data-last-seq", String(lastSeq));
      askForGap();
    }

    // A gap: ask for the missing range (again every 2 s while it stays open: a reply can be lost too).
    function askForGap() {
      if (highest <= lastSeq || Date.now() - gapAsked < 2000 || !socket || socket.readyState !== 1) return;
      gapAsked = Date.now();
      var waiting = Object.keys(pending).map(Number);
      var until = waiting.length ? Math.min.apply(null, waiting) - 1 : highest;
      socket.send(JSON.stringify({ type: "resend", after: lastSeq, until: until }));
    }
    if (kind === "session") setInterval(askForGap, 1000);

    function applyApproval(msg) {
      var key = msg.event.session_id + ":" + msg.event.seq;
      if (seen[key]) return;
      seen[key] = true;
      seenOrder.push(key);
      if (seenOrder.length > MAX_SEEN) delete seen[seenOrder.shift()]; // applying an old one again is harmless
      applyHtml(msg.html);
      if (msg.event.created_at > since) since = msg.event.created_at;
    }

    // Presence (approvals_app/presence.py): the decision page says who looks at it, every 10 s.
    var presenceToken = root.getAttribute("data-presence-token") || "";
    function sayViewing() {
      if (presenceToken && socket && socket.readyState === 1) {
        socket.send(JSON.stringify({ type: "viewing", token: presenceToken }));
      }
    }
    if (presenceToken) setInterval(sayViewing, 10000);

    function open() {
      var scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
      socket = new WebSocket(scheme + window.location.host + path);
      socket.onopen = function () {
        retry = 0;
        setState("live", "live");
        var hello = kind === "session" ? { type: "hello", last_seq: lastSeq } : { type: "hello", since: since };
        socket.send(JSON.stringify(hello));
        sayViewing();
      };
      socket.onmessage = function (e) {
        var msg;
        try { msg = JSON.parse(e.data); } catch (err) { return; }
        if (msg.type === "presence") { seePresence(msg); return; }
        if (msg.type !== "event" || !msg.event) return;
        if (kind === "session") applySession(msg); else applyApproval(msg);
      };
      socket.onclose = function (e) {
        if (e.code === 4401 || e.code === 4403) {
          setState("off", e.code === 4401 ? "signed out" : "no access");
          return;
        }
        setState("off", "reconnecting…");
        retry = Math.min(retry + 1, 5);
        setTimeout(open, 500 * retry);
      };
    }
    open();
  }

  // request id -> {user: time (ms) until which they count as viewing}
  var viewers = {};
  function seePresence(msg) {
    var seen = viewers[msg.request_id] || (viewers[msg.request_id] = {});
    seen[msg.user] = Date.now() + (msg.ttl || 30) * 1000;
    showPresence();
  }
  function showPresence() {
    var now = Date.now();
    var els = document.querySelectorAll("[data-presence-for]");
    for (var i = 0; i < els.length; i++) {
      var seen = viewers[els[i].getAttribute("data-presence-for")] || {};
      var names = Object.keys(seen).filter(function (u) { return seen[u] > now; }).sort();
      els[i].textContent = names.length ? "viewing: " + names.join(", ") : "";
    }
  }

  function tickTimes() {
    var now = Date.now();
    var els = document.querySelectorAll("time[data-rel]");
    for (var i = 0; i < els.length; i++) {
      var t = Date.parse(els[i].getAttribute("datetime"));
      if (isNaN(t)) continue;
      var s = Math.max(0, Math.round((now - t) / 1000));
      var label = s < 60 ? s + " s" : s < 3600 ? Math.floor(s / 60) + " min" :
        s < 86400 ? Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min" : Math.floor(s / 86400) + " d";
      if (els[i].textContent !== label + " ago") els[i].textContent = label + " ago";
    }
  }

  // A message at the top of the page (as Django's messages are shown).
  function flash(text, level) {
    var list = document.querySelector("ul.messages");
    if (!list) {
      list = document.createElement("ul");
      list.className = "messages";
      var main = document.querySelector("main");
      main.parentNode.insertBefore(list, main);
    }
    var item = document.createElement("li");
    item.className = "msg " + (level || "error");
    item.setAttribute("role", "alert");
    item.textContent = text;
    list.appendChild(item);
  }

  // A server error answering an htmx request is not swapped in (base.html's responseHandling: it
  // replaced the form it came from with "Server Error (500)"); a refusal with nothing to swap
  // (a button with hx-swap="none") is said, not only logged.
  document.addEventListener("htmx:responseError", function (e) {
    var xhr = e.detail && e.detail.xhr;
    var status = xhr ? xhr.status : 0;
    if (status >= 500) {
      flash("The server failed to do that (" + status + "). Reload the page and try again.");
    } else if (status === 403) {
      flash("You are not allowed to do that.");
    }
  });
  document.addEventListener("htmx:sendError", function () {
    flash("The server did not answer. Check the connection and try again.");
  });

  // A form posted once is not posted again by a second click while its page is still shown (the
  // server also does a form's work once per rendering: agentops/idempotency.py).
  // A form with data-confirm asks first (no inline handlers under the CSP).
  document.addEventListener("submit", function (e) {
    var form = e.target;
    var ask = form && form.getAttribute("data-confirm");
    if (ask && !form.getAttribute("data-sent") && !window.confirm(ask)) { e.preventDefault(); return; }
    if (!form || (form.getAttribute("method") || "").toLowerCase() !== "post" || form.hasAttribute("hx-post")) return;
    if (form.getAttribute("data-sent")) { e.preventDefault(); return; }
    form.setAttribute("data-sent", "1");
  });
  window.addEventListener("pageshow", function () {  // Back to a page kept in the browser's cache
    var sent = document.querySelectorAll("form[data-sent]");
    for (var i = 0; i < sent.length; i++) sent[i].removeAttribute("data-sent");
  });

  document.addEventListener("DOMContentLoaded", function () {
    // A page may follow more than one stream (the decision page: the approvals and its session).
    var roots = document.querySelectorAll("[data-live]");
    for (var i = 0; i < roots.length && "WebSocket" in window; i++) connect(roots[i]);
    tickTimes();
    setInterval(tickTimes, 1000);  // a label in seconds ("started 12 s ago") stays true
    setInterval(showPresence, 5000);
  });
})();
