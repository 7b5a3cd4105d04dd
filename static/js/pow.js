// Proof of work (see docs/api.md, "Fair openings"): a sale or poll that asks for
// one gets a challenge from the shop, solved in a Web Worker (pow-worker.js) with
// WebCrypto before the join, the ticket or the vote, while the page says
// "Checking your browser…" with its progress.

import { api } from "./api.js";

/**
 * Solves `challenge` to `bits` zero bits in a worker: the `Proof-Of-Work` value.
 * `onProgress(share)` hears the expected share done (0 to 1; luck may end it
 * sooner or later).
 */
export function solve(challenge, bits, onProgress) {
  return new Promise((resolve, reject) => {
    const worker = new Worker("/static/js/pow-worker.js");
    const expected = 2 ** bits;
    worker.onmessage = (event) => {
      const m = event.data;
      if (m.progress !== undefined) {
        if (onProgress) onProgress(Math.min(0.99, m.progress / expected));
        return;
      }
      worker.terminate();
      if (m.proof) resolve(m.proof);
      else reject(new Error(m.error || "no proof"));
    };
    worker.onerror = (e) => {
      worker.terminate();
      reject(e);
    };
    worker.postMessage({ challenge, bits });
  });
}

/**
 * The headers a step into a sale or poll (`kind`: "sales" or "polls") needs:
 * `{headers}` (empty when no proof is asked), or `{failed}`, the challenge's
 * refused answer (signed out, not found). `onProgress` as for `solve`.
 */
export async function proofHeaders(kind, id, onProgress) {
  const res = await api("GET", `/api/${kind}/${id}/challenge`);
  if (res.status !== 200) return { failed: res };
  const { challenge, difficulty } = res.data;
  if (!difficulty) return { headers: {} };
  if (onProgress) onProgress(0);
  try {
    const proof = await solve(challenge, difficulty, onProgress);
    return { headers: { "Proof-Of-Work": proof } };
  } catch (_) {
    return {
      failed: {
        status: 0,
        ok: false,
        headers: new Headers(),
        data: { error: "proof", message: "This browser could not complete the check. Try another browser." },
      },
    };
  }
}

/** "Checking your browser… 40%" for `show(kind, title, detail)`. */
export function checkingWords(share) {
  return ["Checking your browser…", `${Math.round(share * 100)}% of the expected work done. This keeps bots out; it takes a moment.`];
}

/**
 * A POST into a sale or poll (`kind`, `id`) that may ask for a proof of work:
 * with `difficulty` above 0 the proof is solved first, in a worker
 * (`onProgress` as for `solve`), then `path` is posted carrying it. The answer,
 * or the challenge's refusal.
 */
export async function postWithProof(kind, id, path, difficulty, onProgress) {
  let proof = { headers: {} };
  if (Number(difficulty) > 0) proof = await proofHeaders(kind, id, onProgress);
  return proof.failed || (await api("POST", path, undefined, proof.headers));
}
