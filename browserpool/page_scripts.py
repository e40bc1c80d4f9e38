"""JavaScript the worker installs in every page (once per context, as an init script).

It gives the worker an event-driven settle check: ``window.__wgSettle(quietMs, idleCapMs)`` resolves
when the document has loaded, no fetch/XHR is pending and the DOM has not changed for ``quietMs``
("quiet"); "busy" when that never happens within ``idleCapMs``; "navigating" as soon as the document
starts to leave (the Navigation API's navigate event, or pagehide). No polling: timers are only
re-armed by mutations and network events.
It also keeps the episode in one tab, like the original: links and forms with a target open in the
same tab and ``window.open`` navigates the current page.
"""

INIT_SCRIPT = r"""
(() => {
  if (window.__wgSettle) return;
  let pending = 0, lastChange = performance.now(), leaving = false;
  const wake = new Set();
  const poke = () => { lastChange = performance.now(); for (const f of wake) f(); };

  const origFetch = window.fetch;
  if (origFetch) {
    window.fetch = function (...args) {
      pending++; poke();
      return origFetch.apply(this, args).finally(() => { pending--; poke(); });
    };
  }
  const origSend = XMLHttpRequest.prototype.send;
  XMLHttpRequest.prototype.send = function (...args) {
    pending++; poke();
    this.addEventListener('loadend', () => { pending--; poke(); }, { once: true });
    return origSend.apply(this, args);
  };

  const observe = () => new MutationObserver(poke).observe(document, {
    subtree: true, childList: true, attributes: true, characterData: true });
  if (document.documentElement) observe(); else document.addEventListener('DOMContentLoaded', observe);
  document.addEventListener('readystatechange', poke);

  const markLeaving = (e) => {
    if (e && e.navigationType === 'push' && e.hashChange) return;
    if (e && e.destination && e.destination.sameDocument) return;
    leaving = true; poke();
  };
  if (window.navigation) window.navigation.addEventListener('navigate', markLeaving);
  window.addEventListener('pagehide', () => markLeaving());
  window.addEventListener('beforeunload', () => markLeaving());

  // One tab per episode: targets become _self, window.open navigates in place.
  const selfTarget = (e) => {
    const el = e.target && e.target.closest && e.target.closest('a[target], form[target]');
    if (el) el.target = '_self';
  };
  document.addEventListener('click', selfTarget, true);
  document.addEventListener('submit', selfTarget, true);
  window.open = (url) => { if (url) location.href = url; return window; };

  window.__wgSettle = (quietMs, idleCapMs) => new Promise((resolve) => {
    const start = performance.now();
    let timer = null;
    const finish = (v) => { wake.delete(check); clearTimeout(timer); resolve(v); };
    const check = () => {
      if (leaving) return finish('navigating');
      const now = performance.now();
      if (now - start >= idleCapMs) return finish('busy');
      clearTimeout(timer);
      if (document.readyState === 'complete' && pending === 0) {
        // Quiet since the check began, too: a reaction the action scheduled on a timer (a first
        // mutation 10 ms after a click) must not be missed because the DOM was quiet before it.
        const quietFor = now - Math.max(lastChange, start);
        if (quietFor >= quietMs) return finish('quiet');
        timer = setTimeout(check, Math.min(quietMs - quietFor, idleCapMs - (now - start)) + 1);
      } else {
        timer = setTimeout(check, idleCapMs - (now - start) + 1);
      }
    };
    wake.add(check);
    check();
  });
})();
"""

# Centre of the first visible element matching a selector, in viewport CSS pixels, plus whether it
# lies inside the viewport. Used by the scripted policy and by selector-targeted actions.
LOCATE_FN = r"""
(sel) => {
  let el;
  try { el = document.querySelector(sel); } catch (e) { return { error: 'bad selector: ' + e.message }; }
  const all = el ? Array.from(document.querySelectorAll(sel)) : [];
  for (const cand of all) {
    const r = cand.getBoundingClientRect();
    const style = getComputedStyle(cand);
    if (r.width < 1 || r.height < 1 || style.visibility === 'hidden' || style.display === 'none') continue;
    const x = r.left + r.width / 2, y = r.top + r.height / 2;
    return { found: true, x, y, width: r.width, height: r.height,
             inView: y >= 0 && y < innerHeight && x >= 0 && x < innerWidth,
             below: y >= innerHeight, viewportHeight: innerHeight };
  }
  return { found: false };
}
"""

# Scroll the scrollable element under (x, y), or the window when there is none.
SCROLL_FN = r"""
([dy, x, y]) => {
  let el = (x === null) ? null : document.elementFromPoint(x, y);
  while (el && el !== document.body && el !== document.documentElement) {
    const s = getComputedStyle(el);
    if (/(auto|scroll)/.test(s.overflowY) && el.scrollHeight > el.clientHeight) {
      el.scrollBy({ top: dy, behavior: 'instant' });
      return 'element';
    }
    el = el.parentElement;
  }
  window.scrollBy({ top: dy, behavior: 'instant' });
  return 'window';
}
"""
