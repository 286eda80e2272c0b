// keel's web console (docs/console.md): plain pages over the daemon's own
// API, as ES modules with no build step. The token lives in an HttpOnly
// cookie these scripts cannot read; every request that changes something
// carries X-Keel-Console: 1 (the daemon refuses a cookie-authenticated
// change without it).

import { el, guarded, leaving, show } from "./lib.js";
import { conversationPage } from "./conversation.js";
import {
  actorsPage, conversationsPage, healthPage, logPage, newConversationPage, signInPage,
} from "./pages.js";

const signOutButton = document.getElementById("sign-out");

async function route() {
  for (const close of leaving.splice(0)) close();
  const hash = location.hash.replace(/^#/, "") || "/";
  const parts = hash.split("/").filter(Boolean).map(decodeURIComponent);
  signOutButton.hidden = parts[0] === "sign-in";
  await guarded(async () => {
    if (parts[0] === "sign-in") return signInPage();
    if (parts.length === 0) return conversationsPage();
    if (parts[0] === "new") return newConversationPage();
    if (parts[0] === "c" && parts[1] && parts[2] === "log") return logPage(parts[1]);
    if (parts[0] === "c" && parts[1]) return conversationPage(parts[1]);
    if (parts[0] === "actors") return actorsPage();
    if (parts[0] === "health") return healthPage();
    show(el("p", {}, "No such page. "), el("a", { href: "#/" }, "Conversations"));
  });
}

window.addEventListener("hashchange", route);
signOutButton.addEventListener("click", async () => {
  await fetch("/console/session", { method: "DELETE", headers: { "X-Keel-Console": "1" }, credentials: "same-origin" });
  location.hash = "#/sign-in";
});

route();
