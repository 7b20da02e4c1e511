// The DPP tool's page (dpp.html): every slider move asks the console for the numbers (POST
// /dpp/numbers: the release's own functions on the server) and draws them; nothing is computed here
// but the slider's position on its log scale. window.dppLast holds the last answer drawn.
"use strict";

(() => {
  const root = document.getElementById("dpp");
  if (!root) return;
  const $ = (id) => document.getElementById(id);
  const token = () => document.querySelector('meta[name="csrf-token"]').content;
  const requestId = root.dataset.request;
  let start = JSON.parse(root.dataset.start || "{}");
  let noise = start.max_noise || 1;
  let range = null; // [lowest, highest] noise of the curve: the slider's log scale
  let busy = false, again = false;

  function problem(text) {
    const box = $("problem");
    box.textContent = text || "";
    box.hidden = !text;
  }

  async function post(url, body) {
    const response = await fetch(url, {
      method: "POST", credentials: "same-origin",
      headers: {"Content-Type": "application/json", "Accept": "application/json", "X-CSRF-Token": token()},
      body: JSON.stringify(body),
    });
    const answer = await response.json().catch(() => ({error: `the console answered ${response.status}`}));
    if (!response.ok) throw new Error(answer.error || `the console answered ${response.status}`);
    return answer;
  }

  // three significant digits: the tolerance a person reads back in the summary (±6.37, not ±6.37438)
  const noiseFromSlider = (pos) => Number((range[0] * Math.pow(range[1] / range[0], pos / 1000)).toPrecision(3));
  const sliderFromNoise = (value) => Math.round(1000 * Math.log(value / range[0]) / Math.log(range[1] / range[0]));

  function place(values) {
    for (const id of ["trust", "sensitivity", "max_risk", "n", "p"]) if (values[id] !== undefined) $(id).value = values[id];
    if (values.m !== undefined) $("m").value = String(values.m);
    const pick = $("headline");
    pick.replaceChildren(...(values.headlines || []).map((name) => new Option(name, name, false, name === values.headline)));
    noise = values.max_noise || noise;
    $("noise-out").textContent = `±${noise.toPrecision(3)}`;
  }

  function whatif() {
    const changes = {};
    if ($("whatif-cu").value) changes.max_partitions = parseInt($("whatif-cu").value, 10);
    if ($("whatif-weight").value) changes.selection_weight = parseFloat($("whatif-weight").value);
    const bounds = {};
    for (const input of document.querySelectorAll("[data-bounds]")) {
      const pair = input.value.split(",").map((x) => parseFloat(x));
      if (input.value.trim() && pair.length === 2 && pair.every(Number.isFinite)) bounds[input.dataset.bounds] = pair;
    }
    if (Object.keys(bounds).length) changes.bounds = bounds;
    return Object.keys(changes).length ? changes : null;
  }

  function payload() {
    return {
      request_id: requestId || undefined, draft: requestId ? undefined : $("draft").value,
      trust: parseFloat($("trust").value), sensitivity: parseFloat($("sensitivity").value),
      max_risk: parseFloat($("max_risk").value), max_noise: noise, n: parseInt($("n").value, 10),
      m: parseInt($("m").value, 10), p: parseFloat($("p").value), headline: $("headline").value || null,
      whatif: whatif(),
    };
  }

  async function update() {
    if (busy) { again = true; return; }
    busy = true;
    root.dataset.busy = "true";
    problem("");
    try {
      do {
        again = false;
        const answer = await post("/dpp/numbers", payload());
        if (!again) draw(answer);
      } while (again);
    } catch (err) {
      problem(err.message);
    } finally {
      busy = false;
      root.dataset.busy = "false";
      root.dataset.updates = String(parseInt(root.dataset.updates, 10) + 1);
    }
  }

  const plotted = (id, traces, layout) => window.Plotly.react($(id), traces, {margin: {t: 20, r: 20}, ...layout},
                                                               {displaylogo: false, responsive: true});

  function draw(out) {
    window.dppLast = out;
    range = out.noise_range;
    $("noise").value = sliderFromNoise(noise);
    $("noise-out").textContent = `±${noise.toPrecision(3)} at ${Math.round(out.confidence * 100)}%`;
    for (const id of ["trust", "sensitivity", "max_risk"]) $(`${id}-out`).textContent = `${$(id).value} (${out.levels[id]})`;
    $("epsilon").textContent = out.feasible ? out.epsilon_written
      : (out.epsilon_written ? `${out.epsilon_written} needed, above what the risk allows` : "none meets the noise");
    $("shares").textContent = out.shares.length
      ? "Split: " + out.shares.map((s) => `${s.part} ${s.written}`).join(", ") : "";
    $("summary").textContent = out.summary;
    $("summary").classList.toggle("refused", !out.feasible);
    if ($("use")) $("use").disabled = !out.feasible;
    for (const c of document.querySelectorAll("#intervals .confidence")) c.textContent = `${Math.round(out.confidence * 100)}%`;
    drawGraphs(out);
    drawIntervals(out);
  }

  function drawGraphs(out) {
    const point = out.point || {noise: null, risk: null};
    plotted("graph2d", [
      {x: out.curve.noise, y: out.curve.risk, mode: "lines", name: "risk at each noise", line: {color: "#1f6feb"},
       customdata: out.curve.epsilon, hovertemplate: "noise ±%{x:.3g}<br>risk %{y:.3f}<br>epsilon %{customdata:.3g}<extra></extra>"},
      {x: [point.noise], y: [point.risk], mode: "markers", name: "your choice",
       marker: {size: 13, color: out.feasible ? "#116329" : "#b42318"},
       hovertemplate: `epsilon ${out.epsilon_written}<br>noise ±%{x:.3g}<br>risk %{y:.3f}<extra></extra>`},
    ], {xaxis: {title: {text: `noise on ${out.headline} (± at ${Math.round(out.confidence * 100)}%)`}, type: "log"},
        yaxis: {title: {text: "risk"}, range: [0, 1]},
        shapes: [{type: "line", xref: "paper", x0: 0, x1: 1, y0: out.tolerable, y1: out.tolerable,
                  line: {color: "#b42318", dash: "dash"}}],
        annotations: [{xref: "paper", x: 1, y: out.tolerable, text: "tolerable risk", showarrow: false,
                       xanchor: "right", yanchor: "bottom", font: {color: "#b42318"}}]});
    if (out.surface) {
      plotted("graph3d", [
        {type: "surface", x: out.surface.trust, y: out.surface.sensitivity, z: out.surface.risk, colorscale: "RdBu",
         cmin: 0, cmax: 1, opacity: 0.9, name: "risk",
         hovertemplate: "trust %{x}<br>sensitivity %{y}<br>risk %{z:.3f}<extra></extra>"},
        {type: "scatter3d", mode: "markers", x: [parseFloat($("trust").value)], y: [parseFloat($("sensitivity").value)],
         z: [out.risk], marker: {size: 6, color: "#111"}, name: "your choice"},
      ], {scene: {xaxis: {title: {text: "trust"}}, yaxis: {title: {text: "sensitivity"}},
                  zaxis: {title: {text: "risk"}, range: [0, 1]}}, showlegend: false});
    }
    if (out.selection) {
      const lines = [];
      if (out.selection.keep) lines.push({x: out.selection.sizes, y: out.selection.keep, mode: "lines+markers",
                                         name: "as requested", line: {color: "#1f6feb"}});
      const other = out.whatif && out.whatif.selection;
      if (other && other.keep) lines.push({x: other.sizes, y: other.keep, mode: "lines", name: "if changed",
                                           line: {dash: "dash", color: "#7a5300"}});
      plotted("selection", lines, {xaxis: {title: {text: "people in the group"}, type: "log"},
                                   yaxis: {title: {text: "chance the group is released"}, range: [0, 1.02]}});
      $("selection-text").textContent = out.selection.note + (out.selection.half_from
        ? `; a group of ${out.selection.half_from} people or more appears at least half the time.` : ".");
    }
  }

  function drawIntervals(out) {
    const changed = Object.fromEntries(((out.whatif && out.whatif.intervals) || []).map((r) => [r.name, r]));
    const rows = out.intervals.map((r) => {
      const tr = document.createElement("tr");
      tr.dataset.statistic = r.name;
      const group = r.reference_count ? ` for ${r.reference_count} people` : "";
      const width = r.halfwidth === null ? 0 : Math.min(100, r.halfwidth);
      const cells = [r.name, r.written + group, "", changed[r.name] ? changed[r.name].written : "", r.note];
      cells.forEach((text, i) => {
        const td = document.createElement("td");
        if (i === 2) {
          td.className = "bar";
          const bar = document.createElement("span");
          bar.style.width = `${width}%`;
          bar.classList.toggle("wide", r.halfwidth === null || r.halfwidth > 100);
          td.append(bar);
        } else td.textContent = text;
        if (i === 1) td.className = "written";
        tr.append(td);
      });
      return tr;
    });
    document.querySelector("#intervals tbody").replaceChildren(...rows);
    const holder = $("whatif-bounds");
    if (!holder.childElementCount) {
      for (const r of out.intervals.filter((x) => x.bounds)) {
        const label = document.createElement("label");
        label.textContent = `Bounds of ${r.name} `;
        const input = document.createElement("input");
        input.dataset.bounds = r.name;
        input.placeholder = r.bounds.join(", ");
        input.setAttribute("aria-label", `bounds of ${r.name}`);
        label.append(input);
        holder.append(label);
      }
    }
  }

  async function use() {
    const button = $("use");
    button.disabled = true;
    problem("");
    try {
      const answer = await post(`/dpp/${requestId}/use`, payload());
      $("used").textContent = answer.message;
      $("used").hidden = false;
    } catch (err) {
      problem(err.message);
    } finally {
      button.disabled = false;
    }
  }

  async function explore() {
    problem("");
    try {
      start = (await post("/dpp/numbers", {draft: $("draft").value, defaults: true})).defaults;
      place(start);
      update();
    } catch (err) {
      problem(err.message);
      root.dataset.updates = String(parseInt(root.dataset.updates, 10) + 1);  // answered: with a problem
    }
  }

  function ready() {
    for (const id of ["trust", "sensitivity", "max_risk", "n", "m", "p", "headline", "whatif-cu", "whatif-weight"]) {
      $(id).addEventListener(id === "headline" || id === "m" ? "change" : "input", () => {
        if (id === "headline") {  // start from the new statistic's noise at the current epsilon
          const row = (window.dppLast.intervals || []).find((r) => r.name === $("headline").value);
          if (row && row.halfwidth > 0) noise = row.halfwidth;
        }
        update();
      });
    }
    $("whatif-bounds").addEventListener("change", update);
    $("noise").addEventListener("input", () => { if (range) { noise = noiseFromSlider(parseFloat($("noise").value)); update(); } });
    // the buttons are disabled until here: a click before this script ran (plotly.js is large) did nothing
    for (const [id, action] of [["use", use], ["explore", explore]]) {
      if ($(id)) { $(id).addEventListener("click", action); $(id).disabled = false; }
    }
    if (requestId && start.headline) { place(start); update(); }
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", ready); else ready();
})();
