// Calling a shopper back when the waiting room lets them in (issue 50): their turn
// lasts 30 s, and a tab in the background or a phone in a pocket would miss it.
// The tab's title blinks until the tab is focused; a short beep (Web Audio) and a
// vibration where the browser allows; and a notification if the shopper asked for
// one ("Notify me when it's my turn", which asks the browser's permission).
//
// Browsers let a page play sound only after the shopper touched it: the Join and
// Notify buttons unlock the audio (`unlockSound`), so the beep can sound later.

const BLINK_MS = 1000;

let audio = null;

/** Makes the beep possible later: call from a click. */
export function unlockSound() {
  const Context = window.AudioContext || window.webkitAudioContext;
  if (!Context) return;
  try {
    if (!audio) audio = new Context();
    if (audio.state === "suspended") audio.resume();
  } catch {
    audio = null;
  }
}

/** Two short tones, if the page may play sound. */
function beep() {
  if (!audio) unlockSound();
  if (!audio) return;
  try {
    if (audio.state === "suspended") audio.resume();
    for (const [at, hz] of [[0, 880], [0.25, 1175]]) {
      const tone = audio.createOscillator();
      const gain = audio.createGain();
      tone.frequency.value = hz;
      gain.gain.setValueAtTime(0.2, audio.currentTime + at);
      gain.gain.exponentialRampToValueAtTime(0.001, audio.currentTime + at + 0.2);
      tone.connect(gain).connect(audio.destination);
      tone.start(audio.currentTime + at);
      tone.stop(audio.currentTime + at + 0.22);
    }
  } catch {
    // No sound here: the title, the vibration and the notification remain.
  }
}

/** Whether this browser can show notifications, and what the shopper said. */
export function notifyPermission() {
  return "Notification" in window ? Notification.permission : "unsupported";
}

/** Asks the browser's permission to notify; answers the permission now. */
export async function askToNotify() {
  unlockSound();
  if (!("Notification" in window)) return "unsupported";
  try {
    return await Notification.requestPermission();
  } catch {
    return Notification.permission;
  }
}

let blinking = 0;
let restTitle = "";

/** Blinks `words` in the tab's title until the tab is focused. */
function blinkTitle(words) {
  stopBlinking();
  restTitle = document.title;
  let on = false;
  const tick = () => {
    if (document.hasFocus() && document.visibilityState === "visible") {
      stopBlinking();
      return;
    }
    on = !on;
    document.title = on ? words : restTitle;
  };
  document.title = words;
  on = true;
  blinking = setInterval(tick, BLINK_MS);
  window.addEventListener("focus", stopBlinking, { once: true });
}

export function stopBlinking() {
  if (!blinking) return;
  clearInterval(blinking);
  blinking = 0;
  document.title = restTitle;
}

/** The shopper was let in: call them back by every way the browser allows. */
export function callBack({ saleName, seconds }) {
  const words = "Your turn: buy now!";
  blinkTitle(`▶ ${words}`);
  beep();
  if (navigator.vibrate) {
    try {
      navigator.vibrate([300, 150, 300]);
    } catch {
      // Not allowed here.
    }
  }
  if (notifyPermission() === "granted") {
    try {
      const note = new Notification(words, {
        body: `${saleName}: you have ${seconds} s to buy.`,
        tag: `stampede-turn-${location.pathname}`,
        requireInteraction: true,
      });
      note.onclick = () => {
        window.focus();
        note.close();
      };
    } catch {
      // Some browsers (Android Chrome) notify only from a service worker.
    }
  }
}
