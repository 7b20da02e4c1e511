// The passkey ceremonies (WebAuthn) of the console: enrol, sign in, sign a decision. Everything
// else is plain HTML forms. Each ceremony: POST for options, the browser's passkey prompt, POST the answer.
"use strict";

const csrf = () => document.querySelector('meta[name="csrf-token"]').content;

function say(problem) {
  const box = document.getElementById("problem");
  box.textContent = problem;
  box.hidden = !problem;
}

async function post(url, body) {
  const response = await fetch(url, {
    method: "POST", credentials: "same-origin",
    headers: {"Content-Type": "application/json", "Accept": "application/json", "X-CSRF-Token": csrf()},
    body: JSON.stringify(body || {}),
  });
  const answer = await response.json().catch(() => ({error: `the console answered ${response.status}`}));
  if (!response.ok) throw new Error(answer.error || `the console answered ${response.status}`);
  return answer;
}

async function enrol(button) {
  const base = `/enrol/${button.dataset.token}`;
  const {options} = await post(`${base}/options`);
  const credential = await navigator.credentials.create({publicKey: PublicKeyCredential.parseCreationOptionsFromJSON(options)});
  return post(`${base}/finish`, {credential: credential.toJSON()});
}

async function signin() {
  const {options} = await post("/signin/options");
  const credential = await navigator.credentials.get({publicKey: PublicKeyCredential.parseRequestOptionsFromJSON(options)});
  return post("/signin/finish", {credential: credential.toJSON()});
}

async function decide(button) {
  const form = button.closest("form");
  const release = form.dataset.release;
  const field = (name) => (form.elements[name] ? form.elements[name].value : "");
  const {options} = await post(`/releases/${release}/decision/options`,
    {decision: button.dataset.decision, reason: field("reason"), risk_override: field("risk_override")});
  const credential = await navigator.credentials.get({publicKey: PublicKeyCredential.parseRequestOptionsFromJSON(options)});
  return post(`/releases/${release}/decision`, {credential: credential.toJSON()});
}

const CEREMONIES = {enrol, signin, decide};

document.addEventListener("click", async (event) => {
  const button = event.target.closest("[data-ceremony]");
  if (!button) return;
  event.preventDefault();
  say("");
  for (const b of document.querySelectorAll("[data-ceremony]")) b.disabled = true;
  try {
    const answer = await CEREMONIES[button.dataset.ceremony](button);
    const next = new URLSearchParams(location.search).get("next");
    location.assign(button.dataset.ceremony === "signin" && next && /^\/(?![\/\\])/.test(next)
                    ? next : answer.next);
  } catch (err) {
    say(err.name === "NotAllowedError" ? "The passkey prompt was cancelled or timed out: nothing was done." : err.message);
    for (const b of document.querySelectorAll("[data-ceremony]")) b.disabled = false;
  }
});
