/* promptcache forensic map: the divider (inlined into the page; no network).
 *
 * whatIf() is the second, independent implementation of the formula documented in
 * proxy/whatif.py (a test runs both on the same inputs in a real browser and holds them equal):
 *   cached(k) = sum(t_i, i <= k) - t_c          tail(k) = total - cached(k)
 *   cost(k)   = (cached(k) * cache_read + tail(k) * tail_price) / 1e6
 * tail_price = cache_write_5m | cache_write_1h | input (by the tail's TTL).
 */
(function () {
  "use strict";
  var PER_TOKENS = 1000000;
  var TAIL_FIELDS = { "5m": "cache_write_5m", "1h": "cache_write_1h" };

  function tailPrice(prices, tailTtl) {
    var field = Object.prototype.hasOwnProperty.call(TAIL_FIELDS, tailTtl || "") ? TAIL_FIELDS[tailTtl] : null;
    return field !== null ? prices[field] : prices.input;
  }

  function cost(cached, tail, readPrice, tailRate) {
    return (cached * readPrice + tail * tailRate) / PER_TOKENS;
  }

  function whatIf(tokens, chosen, after, prices, tailTtl) {
    var n = tokens.length, i;
    if (!(0 <= chosen && chosen <= after && after < n)) {
      throw new RangeError("need 0 <= chosen <= after < blocks");
    }
    var total = 0;
    for (i = 0; i < n; i++) total += tokens[i];
    var upTo = 0;
    for (i = 0; i <= after; i++) upTo += tokens[i];
    var cached = upTo - tokens[chosen];
    var rate = tailPrice(prices, tailTtl);
    var base = 0;
    for (i = 0; i < chosen; i++) base += tokens[i];
    return {
      chosen: chosen,
      after: after,
      cached_tokens: cached,
      tail_tokens: total - cached,
      cost_usd: cost(cached, total - cached, prices.cache_read, rate),
      baseline_cost_usd: cost(base, total - base, prices.cache_read, rate)
    };
  }

  window.promptcacheWhatIf = whatIf;

  var dataNode = document.getElementById("pc-data");
  if (!dataNode) return;
  var data = JSON.parse(dataNode.textContent);
  var tokens = data.tokens;
  var n = tokens.length;
  var map = document.getElementById("pc-map");
  var divider = document.getElementById("pc-divider");
  var select = document.getElementById("pc-chosen");
  if (!map || !divider || !n) return;
  var total = 0, cum = [0], i;
  for (i = 0; i < n; i++) { total += tokens[i]; cum.push(total); }
  var state = { chosen: Math.min(Math.max(data.chosen || 0, 0), n - 1), after: 0 };
  state.after = state.chosen;
  var blocks = map.querySelectorAll(".blk");

  function fmtTokens(x) { return x.toLocaleString("en-US"); }
  function fmtUsd(x) { return "$" + x.toFixed(6); }
  function put(id, value, text) {
    var node = document.getElementById(id);
    if (!node) return;
    node.setAttribute("data-value", String(value));
    node.textContent = text;
  }

  function render() {
    var r = whatIf(tokens, state.chosen, state.after, data.prices, data.tail_ttl);
    var x = total ? (cum[state.after + 1] / total) * 100 : 0;
    divider.style.left = x + "%";
    divider.setAttribute("aria-valuemin", String(state.chosen));
    divider.setAttribute("aria-valuemax", String(n - 1));
    divider.setAttribute("aria-valuenow", String(state.after));
    divider.setAttribute("aria-valuetext", "block " + state.chosen + " moved after block " + state.after);
    for (var b = 0; b < blocks.length; b++) {
      blocks[b].classList.toggle("chosen", b === state.chosen);
    }
    put("pc-after", state.after, "after block " + state.after);
    put("pc-cached", r.cached_tokens, fmtTokens(r.cached_tokens));
    put("pc-share", total ? r.cached_tokens / total : 0, total ? ((r.cached_tokens / total) * 100).toFixed(1) + "%" : "-");
    put("pc-tail", r.tail_tokens, fmtTokens(r.tail_tokens));
    put("pc-cost", r.cost_usd, fmtUsd(r.cost_usd));
    put("pc-baseline", r.baseline_cost_usd, fmtUsd(r.baseline_cost_usd));
    put("pc-saving", r.baseline_cost_usd - r.cost_usd, fmtUsd(r.baseline_cost_usd - r.cost_usd));
    if (select && String(select.value) !== String(state.chosen)) select.value = String(state.chosen);
  }

  function setAfter(k) {
    state.after = Math.min(Math.max(k, state.chosen), n - 1);
    render();
  }

  function choose(c) {
    state.chosen = Math.min(Math.max(c, 0), n - 1);
    state.after = state.chosen;
    render();
  }

  function afterFromX(clientX) {
    var rect = map.getBoundingClientRect();
    var t = rect.width ? ((clientX - rect.left) / rect.width) * total : 0;
    var best = state.chosen, bestGap = Infinity;
    for (var k = state.chosen; k < n; k++) {
      var gap = Math.abs(cum[k + 1] - t);
      if (gap < bestGap) { best = k; bestGap = gap; }
    }
    return best;
  }

  divider.addEventListener("keydown", function (e) {
    var step = { ArrowRight: 1, ArrowUp: 1, ArrowLeft: -1, ArrowDown: -1, PageUp: 10, PageDown: -10 }[e.key];
    if (step !== undefined) setAfter(state.after + step);
    else if (e.key === "Home") setAfter(state.chosen);
    else if (e.key === "End") setAfter(n - 1);
    else return;
    e.preventDefault();
  });

  var dragging = false;
  divider.addEventListener("mousedown", function (e) {
    dragging = true;
    divider.focus();
    e.preventDefault();
  });
  document.addEventListener("mousemove", function (e) {
    if (dragging) setAfter(afterFromX(e.clientX));
  });
  document.addEventListener("mouseup", function (e) {
    if (!dragging) return;
    dragging = false;
    setAfter(afterFromX(e.clientX));
  });

  for (var b = 0; b < blocks.length; b++) {
    blocks[b].addEventListener("click", (function (index) {
      return function () { choose(index); };
    })(b));
  }
  if (select) {
    select.addEventListener("change", function () { choose(parseInt(select.value, 10)); });
  }
  render();
})();
