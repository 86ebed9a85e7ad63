// tlsprof-collector's status page. Reads /api/v1/summary, /api/v1/trend and
// /api/v1/agents every 10 s and draws them with Chart.js.
//
// Agent hostnames, identities and algorithm names come from agents, so every
// value reaches the page through textContent, attributes or the canvas, never
// as markup. After each refresh the page writes what it shows into data-*
// attributes (data-points, data-labels, data-value, data-state) so that tests
// can read it from the DOM. Script errors, rejected promises and CSP
// violations are listed in #errors.
"use strict";

(function () {
  const REFRESH_MS = 10000;
  const TREND_MINUTES = 60;
  const TOP_ALGORITHMS = 12;
  const AGENT_ROWS = 200; // the most recently seen; the API gives up to 1000
  const BUCKETS = ["cipher", "signature", "key_exchange", "hash", "other"];
  const BUCKET_LABELS = {
    cipher: "cipher",
    signature: "signature",
    key_exchange: "key exchange",
    hash: "hash",
    other: "other",
  };
  const BUCKET_COLORS = {
    cipher: "#4e79a7",
    signature: "#f28e2b",
    key_exchange: "#59a14f",
    hash: "#e15759",
    other: "#9a9a9a",
  };
  const SHARE_COLOR = "#1f3b73";
  const TLS_CPU_COLOR = "#76b7b2";

  // Errors before the document is parsed wait here.
  const pendingErrors = [];
  function reportError(message) {
    const box = document.getElementById("errors");
    if (!box) {
      pendingErrors.push(message);
      return;
    }
    box.hidden = false;
    box.textContent += (box.textContent ? "\n" : "") + message;
    box.dataset.count = String(Number(box.dataset.count || "0") + 1);
  }
  window.addEventListener("error", (e) => {
    reportError("error: " + e.message + (e.filename ? " (" + e.filename + ":" + e.lineno + ")" : ""));
  });
  window.addEventListener("unhandledrejection", (e) => reportError("unhandled rejection: " + String(e.reason)));
  document.addEventListener("securitypolicyviolation", (e) => {
    reportError("CSP violation: " + e.violatedDirective + " blocked " + (e.blockedURI || "inline code"));
  });

  // ---- formatting ----
  function pct(share) {
    if (!Number.isFinite(share)) return "–";
    const p = share * 100;
    return (p >= 10 || p === 0 ? p.toFixed(1) : p.toFixed(2)) + " %";
  }
  function cpuSeconds(s) {
    if (!Number.isFinite(s)) return "–";
    if (s === 0) return "0 CPU-s";
    if (s >= 100) return s.toFixed(0) + " CPU-s";
    if (s >= 1) return s.toFixed(2) + " CPU-s";
    return (s * 1000).toFixed(0) + " CPU-ms";
  }
  function integer(n) {
    return Number(n).toLocaleString("en-US");
  }
  function age(seconds) {
    if (!Number.isFinite(seconds)) return "never";
    if (seconds < 1) return "just now";
    if (seconds < 90) return Math.round(seconds) + " s ago";
    if (seconds < 5400) return Math.round(seconds / 60) + " min ago";
    if (seconds < 2 * 86400) return (seconds / 3600).toFixed(1) + " h ago";
    return Math.round(seconds / 86400) + " days ago";
  }
  function clock(unixSeconds) {
    const d = new Date(unixSeconds * 1000);
    return String(d.getHours()).padStart(2, "0") + ":" + String(d.getMinutes()).padStart(2, "0");
  }
  function setText(id, text) {
    document.getElementById(id).textContent = text;
  }

  async function getJson(path) {
    const response = await fetch(path, { cache: "no-store", headers: { Accept: "application/json" } });
    if (!response.ok) {
      let detail = "";
      try {
        detail = (await response.json()).error || "";
      } catch (_) {
        // not JSON: the status line says enough
      }
      throw new Error(path + ": HTTP " + response.status + (detail ? " (" + detail + ")" : ""));
    }
    return response.json();
  }

  // ---- charts ----
  const charts = {};

  function baseOptions() {
    return {
      responsive: true,
      maintainAspectRatio: false,
      animation: false,
      plugins: { legend: { labels: { boxWidth: 12, boxHeight: 12 } } },
    };
  }

  function makeCharts() {
    Chart.defaults.font.family = "'DejaVu Sans', system-ui, sans-serif";
    Chart.defaults.font.size = 12;
    Chart.defaults.color = "#3c4350";

    const bucketOptions = baseOptions();
    bucketOptions.cutout = "58%";
    bucketOptions.plugins.legend.position = "right";
    bucketOptions.plugins.tooltip = {
      callbacks: { label: (c) => " " + c.label },
    };
    charts.buckets = new Chart(canvasOf("buckets"), {
      type: "doughnut",
      data: { labels: [], datasets: [{ data: [], backgroundColor: [], borderWidth: 1 }] },
      options: bucketOptions,
    });

    const algorithmOptions = baseOptions();
    algorithmOptions.indexAxis = "y";
    algorithmOptions.plugins.legend.display = false;
    algorithmOptions.plugins.tooltip = {
      callbacks: {
        label: (c) => " " + pct(c.raw) + " of TLS CPU (" + c.dataset.meta[c.dataIndex] + ")",
      },
    };
    algorithmOptions.scales = {
      x: {
        beginAtZero: true,
        ticks: { callback: (v) => Math.round(v * 100) + " %" },
        title: { display: true, text: "share of TLS CPU" },
      },
      y: { ticks: { autoSkip: false } },
    };
    charts.algorithms = new Chart(canvasOf("algorithms"), {
      type: "bar",
      data: { labels: [], datasets: [{ data: [], backgroundColor: [], meta: [], barPercentage: 0.8 }] },
      options: algorithmOptions,
    });

    const trendOptions = baseOptions();
    trendOptions.interaction = { mode: "index", intersect: false };
    trendOptions.plugins.tooltip = {
      callbacks: {
        label: (c) =>
          " " + c.dataset.label + ": " + (c.dataset.yAxisID === "share" ? pct(c.raw) : cpuSeconds(c.raw) + " / min"),
      },
    };
    trendOptions.scales = {
      // offset: the current minute's point is not clipped at the right edge.
      x: {
        offset: true,
        ticks: { maxTicksLimit: 13, maxRotation: 0 },
        title: { display: true, text: "minute (local time)" },
      },
      share: {
        type: "linear",
        position: "left",
        beginAtZero: true,
        ticks: { callback: (v) => (v * 100).toFixed(0) + " %" },
        title: { display: true, text: "TLS share of busy CPU" },
      },
      cpu: {
        type: "linear",
        position: "right",
        beginAtZero: true,
        grid: { drawOnChartArea: false },
        title: { display: true, text: "TLS CPU-seconds / min" },
      },
    };
    charts.trend = new Chart(canvasOf("trend"), {
      type: "line",
      data: {
        labels: [],
        datasets: [
          {
            label: "TLS share",
            yAxisID: "share",
            data: [],
            borderColor: SHARE_COLOR,
            backgroundColor: SHARE_COLOR,
            borderWidth: 2,
            pointRadius: 3,
            spanGaps: false,
          },
          {
            label: "TLS CPU-seconds per minute",
            yAxisID: "cpu",
            data: [],
            borderColor: TLS_CPU_COLOR,
            backgroundColor: TLS_CPU_COLOR,
            borderWidth: 2,
            borderDash: [5, 3],
            pointRadius: 3,
            spanGaps: false,
          },
        ],
      },
      options: trendOptions,
    });

    const stackedOptions = baseOptions();
    stackedOptions.interaction = { mode: "index", intersect: false };
    stackedOptions.plugins.tooltip = {
      callbacks: { label: (c) => " " + c.dataset.label + ": " + cpuSeconds(c.raw) + " / min" },
    };
    stackedOptions.scales = {
      x: {
        stacked: true,
        ticks: { maxTicksLimit: 13, maxRotation: 0 },
        title: { display: true, text: "minute (local time)" },
      },
      y: { stacked: true, beginAtZero: true, title: { display: true, text: "CPU-seconds / min" } },
    };
    charts.trendBuckets = new Chart(canvasOf("trend-buckets"), {
      type: "bar",
      data: {
        labels: [],
        datasets: BUCKETS.map((b) => ({ label: BUCKET_LABELS[b], data: [], backgroundColor: BUCKET_COLORS[b] })),
      },
      options: stackedOptions,
    });
  }

  function canvasOf(id) {
    return document.querySelector("#" + id + " canvas");
  }

  // Marks a chart's panel with what it holds (for people: the placeholder;
  // for tests: data-points and data-labels).
  function markPanel(id, points, labels) {
    const panel = document.getElementById(id);
    panel.dataset.points = String(points);
    panel.dataset.labels = JSON.stringify(labels);
    panel.dataset.ready = "1";
    panel.querySelector(".placeholder").hidden = points > 0;
    panel.querySelector(".chart").classList.toggle("empty", points === 0);
  }

  function renderSummary(summary) {
    const share = summary.tls_share;
    const shareBox = document.getElementById("share");
    shareBox.textContent = summary.reports > 0 ? pct(share) : "–";
    shareBox.dataset.value = summary.reports > 0 ? String(share) : "";
    setText("share-sub", "last " + summary.minutes + " min, " + integer(summary.agents) + " agent" +
      (summary.agents === 1 ? "" : "s"));
    setText("tls-cpu", cpuSeconds(summary.tls_cpu_seconds));
    setText("busy-cpu", cpuSeconds(summary.busy_cpu_seconds));
    setText("reports", integer(summary.reports));
    setText("reports-sub", "profile windows in the last " + summary.minutes + " min");
    const span = ", last " + summary.minutes + " min";
    document.querySelector("#buckets .unit").textContent = "% of TLS CPU" + span;
    document.querySelector("#algorithms .unit").textContent = "% of TLS CPU" + span + ", top " + TOP_ALGORITHMS +
      ", coloured by bucket";

    const buckets = summary.buckets.filter((b) => b.cpu_seconds > 0);
    const bucketData = charts.buckets.data;
    bucketData.labels = buckets.map((b) => (BUCKET_LABELS[b.bucket] || b.bucket) + "  " + pct(b.share_of_tls));
    bucketData.datasets[0].data = buckets.map((b) => b.share_of_tls);
    bucketData.datasets[0].backgroundColor = buckets.map((b) => BUCKET_COLORS[b.bucket] || "#cccccc");
    charts.buckets.update("none");
    markPanel("buckets", buckets.length, buckets.map((b) => b.bucket));

    const algorithms = summary.algorithms.filter((a) => a.cpu_seconds > 0).slice(0, TOP_ALGORITHMS);
    const names = {};
    for (const a of algorithms) names[a.algorithm] = (names[a.algorithm] || 0) + 1;
    const algorithmData = charts.algorithms.data;
    // An algorithm seen in two buckets (SHA-256 hashing and inside a
    // signature) gets its bucket in the label.
    // The `other` bucket has no algorithm (record framing, the handshake
    // state machine, set-up and teardown: docs/attribution.md).
    algorithmData.labels = algorithms.map((a) =>
      a.bucket === "other" ? "other TLS code"
      : names[a.algorithm] > 1 ? a.algorithm + " (" + BUCKET_LABELS[a.bucket] + ")" : a.algorithm);
    algorithmData.datasets[0].data = algorithms.map((a) => a.share_of_tls);
    algorithmData.datasets[0].backgroundColor = algorithms.map((a) => BUCKET_COLORS[a.bucket] || "#cccccc");
    algorithmData.datasets[0].meta = algorithms.map((a) => (BUCKET_LABELS[a.bucket] || a.bucket) + ", " +
      cpuSeconds(a.cpu_seconds));
    charts.algorithms.update("none");
    markPanel("algorithms", algorithms.length, algorithms.map((a) => a.algorithm));
  }

  function renderTrend(trend) {
    // Every minute of the hour on the axis; a minute without reports is a gap
    // (null), not a zero.
    const last = Math.floor(trend.now / 60) * 60;
    const byMinute = new Map(trend.points.map((p) => [p.minute, p]));
    const minutes = [];
    for (let m = last - (TREND_MINUTES - 1) * 60; m <= last; m += 60) minutes.push(m);
    // A report whose window ends after the collector's clock (skew) is
    // still counted: extend the axis to it.
    for (const p of trend.points) if (p.minute > last) minutes.push(p.minute);
    const labels = minutes.map(clock);
    const at = (fn) => minutes.map((m) => (byMinute.has(m) ? fn(byMinute.get(m)) : null));

    const data = charts.trend.data;
    data.labels = labels;
    data.datasets[0].data = at((p) => p.tls_share);
    data.datasets[1].data = at((p) => p.tls_cpu_seconds);
    charts.trend.update("none");
    markPanel("trend", trend.points.length, trend.points.map((p) => p.minute));

    const stacked = charts.trendBuckets.data;
    stacked.labels = labels;
    BUCKETS.forEach((b, i) => {
      stacked.datasets[i].data = at((p) => p.bucket_cpu_seconds[b] || 0);
    });
    charts.trendBuckets.update("none");
    markPanel("trend-buckets", trend.points.filter((p) => p.tls_cpu_seconds > 0).length,
      BUCKETS.filter((b) => trend.points.some((p) => p.bucket_cpu_seconds[b] > 0)));
  }

  function cell(row, text, className) {
    const td = document.createElement("td");
    td.textContent = text;
    if (className) td.className = className;
    row.appendChild(td);
    return td;
  }

  function renderAgents(list) {
    const table = document.getElementById("agents");
    const body = table.querySelector("tbody");
    const rows = [];
    for (const a of list.agents) {
      const tr = document.createElement("tr");
      const host = a.relay_host || a.hostname || a.identity;
      tr.dataset.host = host;
      const hostCell = cell(tr, "");
      const dot = document.createElement("span");
      const state = a.age_seconds < 60 ? "fresh" : a.age_seconds < 300 ? "stale" : "silent";
      dot.className = "dot " + state;
      dot.title = state === "fresh" ? "reported in the last minute" :
        state === "stale" ? "no report for over a minute" : "no report for over 5 minutes";
      hostCell.appendChild(dot);
      hostCell.appendChild(document.createTextNode(host));
      cell(tr, a.identity, "mono");
      cell(tr, age(a.age_seconds)).title = new Date(a.last_seen * 1000).toISOString();
      cell(tr, integer(a.reports), "num");
      cell(tr, integer(a.instances), "num");
      cell(tr, integer(a.services), "num");
      cell(tr, integer(a.series), "num");
      rows.push(tr);
    }
    body.replaceChildren(...rows);
    table.dataset.rows = String(rows.length);
    table.hidden = rows.length === 0;
    document.getElementById("agents-empty").hidden = rows.length > 0;
    setText("agents-count", list.total === 0 ? "" :
      list.truncated ? "(the " + integer(rows.length) + " most recent of " + integer(list.total) + ")" :
        "(" + integer(list.total) + ")");
  }

  function renderNotice(summary, trend, agents) {
    const notice = document.getElementById("notice");
    // [text, is code] pieces, put together as text nodes and <code> elements.
    let parts = [];
    if (agents.total === 0 && trend.points.length === 0) {
      parts = [["No reports yet: no agent has sent a profile window to this collector. Start one with "],
        ["tlsprof-agent run --collector HOST:PORT", true], [" (docs/fleet.md); this page refreshes by itself."]];
    } else if (summary.reports === 0) {
      parts = [["No reports in the last " + summary.minutes + " min: the agents below have gone quiet, " +
        "or their windows are still on the way."]];
    }
    notice.replaceChildren(...parts.map(([text, code]) => {
      if (!code) return document.createTextNode(text);
      const element = document.createElement("code");
      element.textContent = text;
      return element;
    }));
    notice.hidden = parts.length === 0;
    document.body.dataset.state = summary.reports > 0 ? "ready" : "empty";
  }

  let refreshTimer = null;
  let refreshes = 0;

  async function refresh() {
    clearTimeout(refreshTimer);
    const minutes = document.getElementById("window").value;
    try {
      const [summary, trend, agents] = await Promise.all([
        getJson("/api/v1/summary?minutes=" + encodeURIComponent(minutes)),
        getJson("/api/v1/trend?minutes=" + TREND_MINUTES),
        getJson("/api/v1/agents?limit=" + AGENT_ROWS),
      ]);
      renderSummary(summary);
      renderTrend(trend);
      renderAgents(agents);
      renderNotice(summary, trend, agents);
      refreshes += 1;
      document.body.dataset.refreshes = String(refreshes);
      setText("updated", "updated " + new Date().toLocaleTimeString("en-GB"));
      document.getElementById("updated").classList.remove("failed");
    } catch (e) {
      // A collector restart or a network blip: say so, keep the last data.
      const updated = document.getElementById("updated");
      updated.textContent = "refresh failed: " + e.message;
      updated.classList.add("failed");
      if (refreshes === 0) document.body.dataset.state = "error";
      reportError("refresh: " + e.message);
    }
    refreshTimer = setTimeout(refresh, REFRESH_MS);
  }

  function start() {
    for (const message of pendingErrors.splice(0)) reportError(message);
    if (typeof Chart === "undefined") {
      reportError("Chart.js did not load (/ui/chart.min.js)");
      document.body.dataset.state = "error";
      return;
    }
    makeCharts();
    document.getElementById("window").addEventListener("change", refresh);
    refresh();
  }

  document.addEventListener("DOMContentLoaded", start);
})();
