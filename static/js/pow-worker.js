// Solves a proof-of-work challenge off the page's thread (see pow.js): the first
// nonce (base 36) such that SHA-256 of `<challenge>:<nonce>` starts with `bits`
// zero bits. WebCrypto's digest is asynchronous, so hashes go in batches of
// promises; progress is posted every 16,384 hashes.

const encoder = new TextEncoder();
const BATCH = 256;
const REPORT_EVERY = 16384;

function zeroBits(buffer) {
  const bytes = new Uint8Array(buffer);
  let bits = 0;
  for (const b of bytes) {
    if (b !== 0) return bits + Math.clz32(b) - 24;
    bits += 8;
  }
  return bits;
}

self.onmessage = async (event) => {
  const { challenge, bits } = event.data;
  const prefix = `${challenge}:`;
  let next = 0;
  let reported = 0;
  try {
    for (;;) {
      const tries = [];
      for (let i = 0; i < BATCH; i++) {
        const nonce = (next + i).toString(36);
        tries.push(crypto.subtle.digest("SHA-256", encoder.encode(prefix + nonce)).then((hash) => [nonce, hash]));
      }
      for (const [nonce, hash] of await Promise.all(tries)) {
        if (zeroBits(hash) >= bits) {
          self.postMessage({ proof: prefix + nonce, hashes: next + BATCH });
          return;
        }
      }
      next += BATCH;
      if (next - reported >= REPORT_EVERY) {
        reported = next;
        self.postMessage({ progress: next });
      }
    }
  } catch (e) {
    self.postMessage({ error: String(e) });
  }
};
