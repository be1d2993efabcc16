// proxyfleet console: keeps the open page current. The server says when
// the fleet changed (server-sent events on /ui/live); the page then
// fetches itself and swaps its <main> for the new one. Pages that show
// rates also ask every data-refresh seconds. Without this script every
// page still works, reloaded by hand.
(function () {
  'use strict';
  var status = document.getElementById('live-status');
  var busy = false;
  var again = false;
  // Changes announced while no stream was up reach nobody: those between
  // rendering this page and the stream's first hello too (under load, a
  // replacement finished in that gap and the page never showed it). So
  // the first hello, like every hello after a lost stream, fetches the
  // page once.
  var lost = true;

  function say(state, text) {
    if (status) {
      status.textContent = text;
      status.setAttribute('data-state', state);
    }
  }

  // A form being filled in is not swapped away under the user.
  function editing() {
    var active = document.activeElement;
    var main = document.querySelector('main');
    return active && main && main.contains(active) &&
      (active.tagName === 'INPUT' || active.tagName === 'SELECT' || active.tagName === 'TEXTAREA');
  }

  function refresh() {
    if (busy || editing()) {
      again = true;
      return;
    }
    busy = true;
    fetch(window.location.href, { credentials: 'same-origin', cache: 'no-store' })
      .then(function (response) {
        if (!response.ok || response.redirected) {
          throw new Error('status ' + response.status);
        }
        return response.text();
      })
      .then(function (text) {
        var fresh = new DOMParser().parseFromString(text, 'text/html').querySelector('main');
        var main = document.querySelector('main');
        if (fresh && main && fresh.innerHTML !== main.innerHTML) {
          main.replaceWith(document.importNode(fresh, true));
        }
      })
      .catch(function () { say('stale', 'not updated: the operator did not answer'); })
      .then(function () {
        busy = false;
        if (again) {
          again = false;
          window.setTimeout(refresh, 250);
        }
      });
  }

  document.addEventListener('focusout', function () {
    if (again) {
      window.setTimeout(refresh, 0);
    }
  });

  if (window.EventSource) {
    var source = new EventSource('/ui/live');
    source.addEventListener('hello', function () {
      say('live', 'live');
      // Changes while the stream was down, or not yet up, were not
      // announced.
      if (lost) {
        lost = false;
        refresh();
      }
    });
    source.addEventListener('change', refresh);
    source.addEventListener('error', function () {
      lost = true;
      say('stale', 'reconnecting…');
    });
  }

  var main = document.querySelector('main');
  var every = main && Number(main.getAttribute('data-refresh'));
  if (every > 0) {
    window.setInterval(refresh, every * 1000);
  }
})();
