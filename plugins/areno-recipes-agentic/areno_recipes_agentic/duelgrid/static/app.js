// DuelGrid browser UI. The page only draws and sends requests: the Python server owns the
// game state and applies every action with the rule engine.
"use strict";

const $ = (id) => document.getElementById(id);
const MOVE_KEYS = { ArrowUp: "up", ArrowDown: "down", ArrowLeft: "left", ArrowRight: "right" };
const ACTION_KEYS = { f: "ATTACK", r: "RANGED_ATTACK", p: "PICKUP", s: "SHIELD" };

let current = null; // the last snapshot from the server
let frames = null; // replay frames, when a replay is being viewed
let frameIndex = 0;
let pending = false; // a request is in flight

async function api(path, body) {
  const options = body === undefined
    ? { method: "GET" }
    : { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) };
  pending = true;
  updateButtons();
  let data = null;
  try {
    const response = await fetch(path, options);
    data = await response.json();
    showError(response.ok ? "" : data.error || response.statusText);
    if (data.state) render(data);
  } catch (err) {
    showError(`request failed: ${err}`);
  } finally {
    pending = false;
    updateButtons();
    drawStatus();
  }
  maybeAutoPlay();
  return data;
}

function showError(text) {
  const box = $("error");
  box.textContent = text;
  box.hidden = !text;
}

function viewing() {
  return frames !== null;
}

function render(snapshot) {
  current = snapshot;
  $("model-name").textContent = snapshot.model;
  if (!viewing()) drawState(snapshot.state);
  drawStatus();
  drawLog(snapshot.log);
  const actions = snapshot.turn_actions.map(describeAction).join(", ");
  $("turn-actions").textContent = actions ? `This turn: ${actions}` : "";
  updateButtons();
}

function describeAction(action) {
  return action.direction ? `${action.type} ${action.direction}` : action.type;
}

function drawState(state) {
  const grid = $("grid");
  grid.style.gridTemplateColumns = `repeat(${state.size}, 56px)`;
  const walls = new Set(state.walls.map(([r, c]) => `${r},${c}`));
  const traps = new Set(state.traps.map(([r, c]) => `${r},${c}`));
  const items = new Map(state.items.map((i) => [`${i.row},${i.col}`, i.kind]));
  const units = new Map(Object.entries(state.units).map(([name, u]) => [`${u.row},${u.col}`, [name, u]]));
  const cells = [];
  for (let r = 0; r < state.size; r++) {
    for (let c = 0; c < state.size; c++) {
      const key = `${r},${c}`;
      const cell = document.createElement("div");
      cell.className = "cell";
      cell.dataset.row = r;
      cell.dataset.col = c;
      if (walls.has(key)) cell.classList.add("wall");
      if (traps.has(key)) cell.classList.add("trap");
      const coord = document.createElement("span");
      coord.className = "coord";
      coord.textContent = `${r},${c}`;
      cell.appendChild(coord);
      if (units.has(key)) {
        const [name, u] = units.get(key);
        const token = document.createElement("div");
        token.className = `unit ${name}`;
        token.id = `unit-${name}`;
        if (u.shielded) token.classList.add("shielded");
        if (state.to_move === name) token.classList.add("to-move");
        token.textContent = name;
        const hp = document.createElement("span");
        hp.className = "hp";
        hp.textContent = u.hp;
        token.appendChild(hp);
        cell.appendChild(token);
      } else if (items.has(key)) {
        const item = document.createElement("div");
        const kind = items.get(key);
        item.className = `item ${kind}`;
        item.textContent = kind === "health" ? "H" : "E";
        cell.appendChild(item);
      }
      cells.push(cell);
    }
  }
  grid.replaceChildren(...cells);
  for (const [name, u] of Object.entries(state.units)) {
    $(`hp-${name}`).textContent = `${u.hp}/${state.rules.max_hp}`;
    $(`energy-${name}`).textContent = `${u.energy}/${state.rules.max_energy}`;
    $(`shield-${name}`).textContent = u.shielded ? "up" : "down";
    $(`hpbar-${name}`).style.width = `${(100 * u.hp) / state.rules.max_hp}%`;
    $(`energybar-${name}`).style.width = `${(100 * u.energy) / state.rules.max_energy}%`;
  }
}

function drawStatus() {
  const status = $("status");
  status.classList.toggle("over", Boolean(current && current.over));
  if (viewing()) {
    const frame = frames[frameIndex];
    const what = frame.unit ? `${frame.unit} played ${frame.actions.map(describeAction).join(", ") || "nothing"}` : "start";
    status.textContent = `Replay, turn ${frameIndex} of ${frames.length - 1}: ${what}`;
    $("frame-label").textContent = `${frameIndex}/${frames.length - 1}`;
    return;
  }
  if (!current) return;
  if (current.over) {
    const text = { U: "you win!", A: "the model wins." }[current.winner] || "nobody wins.";
    status.textContent = `Game over: ${text}`;
  } else if (current.busy || (pending && current.to_move === "A")) {
    status.textContent = "The model is thinking…";
  } else if (current.to_move === "U") {
    status.textContent = "Your turn (U): act, then end your turn.";
  } else {
    status.textContent = "The model's turn (A).";
  }
}

function drawLog(entries) {
  const log = $("log");
  const items = entries.map((entry) => {
    const li = document.createElement("li");
    li.className = entry.kind;
    li.textContent = entry.text;
    return li;
  });
  log.replaceChildren(...items);
  log.scrollTop = log.scrollHeight;
}

function updateButtons() {
  const live = current && !viewing() && !current.over && !current.busy && !pending;
  const mine = live && current.to_move === "U";
  for (const button of document.querySelectorAll("[data-move], [data-action], #btn-end")) {
    button.disabled = !mine;
  }
  $("btn-agent").disabled = !(live && current.to_move === "A");
  $("replay-bar").hidden = !viewing();
  if (viewing()) {
    $("btn-prev").disabled = frameIndex === 0;
    $("btn-next").disabled = frameIndex === frames.length - 1;
  }
}

function maybeAutoPlay() {
  if (!$("auto-agent").checked || !current || viewing() || pending) return;
  if (!current.over && !current.busy && current.to_move === "A") {
    setTimeout(() => {
      if (!pending && current.to_move === "A" && !current.over) agentTurn();
    }, 150);
  }
}

function userAction(action) {
  if (!current || current.to_move !== "U" || pending || viewing()) return;
  api("/api/user_action", { action });
}

function endTurn() {
  if (!current || current.to_move !== "U" || pending || viewing()) return;
  api("/api/user_action", { end_turn: true });
}

function agentTurn() {
  if (!current || current.to_move !== "A" || pending || viewing()) return;
  drawStatus();
  api("/api/agent_turn", {});
}

function newGame() {
  frames = null;
  const seed = $("seed").value;
  api("/api/new", { seed: seed === "" ? null : Number(seed), first: $("first").value });
}

async function replayFile() {
  const file = $("replay-file").files[0];
  if (!file) {
    showError("choose a JSONL file of recorded games first");
    return;
  }
  const text = await file.text();
  const data = await api("/api/replay", { jsonl: text, index: Number($("replay-index").value || 0) });
  if (data && data.frames) showFrames(data.frames);
}

function showFrames(list) {
  frames = list;
  frameIndex = 0;
  drawState(frames[0].state);
  drawStatus();
  updateButtons();
}

function stepFrame(delta) {
  if (!viewing()) return;
  frameIndex = Math.max(0, Math.min(frames.length - 1, frameIndex + delta));
  drawState(frames[frameIndex].state);
  drawStatus();
  updateButtons();
}

function backToGame() {
  frames = null;
  if (current) render(current);
}

function saveGame() {
  if (!current) return;
  const blob = new Blob([JSON.stringify(current.record) + "\n"], { type: "application/jsonl" });
  const link = document.createElement("a");
  link.href = URL.createObjectURL(blob);
  link.download = "duelgrid-game.jsonl";
  link.click();
  setTimeout(() => URL.revokeObjectURL(link.href), 1000);
}

function onKey(event) {
  if (event.target instanceof HTMLInputElement || event.target instanceof HTMLSelectElement) return;
  if (event.key in MOVE_KEYS) {
    event.preventDefault();
    userAction({ type: "MOVE", direction: MOVE_KEYS[event.key] });
  } else if (event.key.toLowerCase() in ACTION_KEYS) {
    userAction({ type: ACTION_KEYS[event.key.toLowerCase()] });
  } else if (event.key === "Enter") {
    endTurn();
  } else if (event.key.toLowerCase() === "m") {
    agentTurn();
  }
}

function setup() {
  for (const button of document.querySelectorAll("[data-move]")) {
    button.addEventListener("click", () => userAction({ type: "MOVE", direction: button.dataset.move }));
  }
  for (const button of document.querySelectorAll("[data-action]")) {
    button.addEventListener("click", () => userAction({ type: button.dataset.action }));
  }
  $("btn-end").addEventListener("click", endTurn);
  $("btn-agent").addEventListener("click", agentTurn);
  $("btn-new").addEventListener("click", newGame);
  $("btn-replay").addEventListener("click", replayFile);
  $("btn-prev").addEventListener("click", () => stepFrame(-1));
  $("btn-next").addEventListener("click", () => stepFrame(1));
  $("btn-live").addEventListener("click", backToGame);
  $("btn-save").addEventListener("click", saveGame);
  $("auto-agent").addEventListener("change", maybeAutoPlay);
  document.addEventListener("keydown", onKey);
  api("/api/state");
}

setup();
