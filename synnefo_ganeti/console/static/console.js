// The console's one script: live updates and the CSRF token of forms.
//
// A page names what it shows live in <main data-topics="...">. This script opens one
// server-sent-events stream for those topics (/events?topics=...) and swaps in each
// "fragment" the server pushes: the element with the fragment's target id is replaced;
// when the page has none, the fragment goes first into the element named by "into" (the
// rows of a list), if it matches the list's filters (data-filter-status, -backend). No
// polling: the stream is fed by the server's one reader of the database.
(function () {
  "use strict";
  var source = null;
  var current = null;

  function csrf() {
    var meta = document.querySelector('meta[name="csrf-token"]');
    return meta ? meta.getAttribute("content") : "";
  }

  // every POST form carries the session's CSRF token (live fragments are rendered once for all viewers)
  function arm(root) {
    var forms = root.querySelectorAll('form[method="post"]');
    for (var i = 0; i < forms.length; i++) {
      var form = forms[i];
      if (form.querySelector('input[name="csrf"]')) continue;
      var input = document.createElement("input");
      input.type = "hidden";
      input.name = "csrf";
      input.value = csrf();
      form.appendChild(input);
    }
  }

  function matches(row, container) {
    var status = container.getAttribute("data-filter-status");
    var backend = container.getAttribute("data-filter-backend");
    if (status && row.getAttribute("data-status") !== status) return false;
    if (backend && row.getAttribute("data-backend") !== backend) return false;
    return true;
  }

  function apply(fragment) {
    var template = document.createElement("template");
    template.innerHTML = fragment.html.trim();
    var node = template.content.firstElementChild;
    if (!node) return;
    var old = document.getElementById(fragment.target);
    if (old) {
      var parent = old.parentElement;
      if (fragment.into && parent && parent.id === fragment.into && !matches(node, parent)) {
        old.remove();
        return;
      }
      old.replaceWith(node);
    } else if (fragment.into) {
      var container = document.getElementById(fragment.into);
      if (!container || container.hasAttribute("data-no-insert") || !matches(node, container)) return;
      container.prepend(node);
      var empty = document.getElementById(fragment.into + "-empty");
      if (empty) empty.remove();
    } else {
      return;
    }
    arm(node.parentElement || document);
    if (window.htmx) window.htmx.process(node);
  }

  function state(value) {
    document.documentElement.setAttribute("data-live", value);
  }

  function subscribe() {
    arm(document);
    var main = document.getElementById("main");
    var topics = main ? main.getAttribute("data-topics") || "" : "";
    topics = topics.trim();
    if (topics === current && source) return;
    if (source) source.close();
    source = null;
    current = topics;
    state("off");
    if (!topics) return;
    source = new EventSource("/events?topics=" + encodeURIComponent(topics));
    source.addEventListener("ready", function () { state("on"); });
    source.addEventListener("fragment", function (event) { apply(JSON.parse(event.data)); });
    source.addEventListener("reload", function () { window.location.reload(); });
    source.onerror = function () { state("reconnecting"); };
  }

  // a page left (or put in the back-forward cache) closes its stream: browsers allow six
  // connections per server, and a stream kept by each page left behind would soon take them all
  function unsubscribe() {
    if (source) source.close();
    source = null;
    current = null;
  }

  document.addEventListener("DOMContentLoaded", subscribe);
  document.addEventListener("htmx:afterSettle", subscribe);
  window.addEventListener("pageshow", subscribe);
  window.addEventListener("pagehide", unsubscribe);
})();
