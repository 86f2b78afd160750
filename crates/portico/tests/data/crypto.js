// The Web Crypto handler of tests/functions_webapi.rs, run by Portico and by Deno (`deno serve`).
//
// GET /vectors: published test vectors (FIPS 180 digests, RFC 4231 HMAC, RFC 7515 appendix A's HS256, RS256 and
// ES256 JWS, RFC 8032 section 7.1's Ed25519) verified, signed again and exported; { total, failures, outputs,
// standardOnly } (outputs to compare with Deno's, and the standard's answers where Deno departs from it).
// GET /keys: keys made here (each algorithm, exported in every format this runtime exports them in) and a
// signature of a message with each.
// POST /check with another runtime's /keys: its keys imported in each format, its signatures verified, and
// the message signed again with its private keys; { checks: { name: true or what went wrong }, signatures }.
// POST /verify with { keys: this runtime's /keys, signatures: another's /check signatures }: those verified
// with the public keys; { name: true or what went wrong }.
// GET /errors: what each misuse of the API throws (the DOMException's name, or the error's class).
// GET /hostile: how many imports of bytes of every shape gave each outcome.

const subtle = crypto.subtle;
const utf8 = (text) => new TextEncoder().encode(text);
const hex = (buffer) => [...new Uint8Array(buffer)].map((b) => b.toString(16).padStart(2, "0")).join("");
const fromHex = (text) => new Uint8Array(text.match(/../g)?.map((h) => parseInt(h, 16)) ?? []);
const b64url = (buffer) => {
  let text = "";
  for (const b of new Uint8Array(buffer)) text += String.fromCharCode(b);
  return btoa(text).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
};
const fromB64url = (text) => {
  const binary = atob(text.replace(/-/g, "+").replace(/_/g, "/"));
  return new Uint8Array([...binary].map((c) => c.charCodeAt(0)));
};
const errorName = (e) => (e instanceof DOMException ? e.name : e?.constructor?.name ?? String(e));
const outcome = async (f) => {
  try {
    return await f();
  } catch (e) {
    return `${errorName(e)}: ${e.message}`;
  }
};

// RFC 7515 appendix A: the JWS signing inputs and keys.
const PAYLOAD = "eyJpc3MiOiJqb2UiLA0KICJleHAiOjEzMDA4MTkzODAsDQogImh0dHA6Ly9leGFtcGxlLmNvbS9pc19yb290Ijp0cnVlfQ";
const HS256 = {
  input: `eyJ0eXAiOiJKV1QiLA0KICJhbGciOiJIUzI1NiJ9.${PAYLOAD}`,
  jwk: { kty: "oct", k: "AyM1SysPpbyDfgZld3umj1qzKObwVMkoqQ-EstJQLr_T-1qS0gZH75aKtMN3Yj0iPS4hcgUuTwjAzZr1Z9CAow" },
  signature: "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk",
};
const RS256 = {
  input: `eyJhbGciOiJSUzI1NiJ9.${PAYLOAD}`,
  jwk: {
    kty: "RSA",
    n: "ofgWCuLjybRlzo0tZWJjNiuSfb4p4fAkd_wWJcyQoTbji9k0l8W26mPddxHmfHQp-Vaw-4qPCJrcS2mJPMEzP1Pt0Bm4d4QlL-yRT-SFd2lZS-pCgNMsD1W_YpRPEwOWvG6b32690r2jZ47soMZo9wGzjb_7OMg0LOL-bSf63kpaSHSXndS5z5rexMdbBYUsLA9e-KXBdQOS-UTo7WTBEMa2R2CapHg665xsmtdVMTBQY4uDZlxvb3qCo5ZwKh9kG4LT6_I5IhlJH7aGhyxXFvUK-DWNmoudF8NAco9_h9iaGNj8q2ethFkMLs91kzk2PAcDTW9gb54h4FRWyuXpoQ",
    e: "AQAB",
    d: "Eq5xpGnNCivDflJsRQBXHx1hdR1k6Ulwe2JZD50LpXyWPEAeP88vLNO97IjlA7_GQ5sLKMgvfTeXZx9SE-7YwVol2NXOoAJe46sui395IW_GO-pWJ1O0BkTGoVEn2bKVRUCgu-GjBVaYLU6f3l9kJfFNS3E0QbVdxzubSu3Mkqzjkn439X0M_V51gfpRLI9JYanrC4D4qAdGcopV_0ZHHzQlBjudU2QvXt4ehNYTCBr6XCLQUShb1juUO1ZdiYoFaFQT5Tw8bGUl_x_jTj3ccPDVZFD9pIuhLhBOneufuBiB4cS98l2SR_RQyGWSeWjnczT0QU91p1DhOVRuOopznQ",
    p: "4BzEEOtIpmVdVEZNCqS7baC4crd0pqnRH_5IB3jw3bcxGn6QLvnEtfdUdiYrqBdss1l58BQ3KhooKeQTa9AB0Hw_Py5PJdTJNPY8cQn7ouZ2KKDcmnPGBY5t7yLc1QlQ5xHdwW1VhvKn-nXqhJTBgIPgtldC-KDV5z-y2XDwGUc",
    q: "uQPEfgmVtjL0Uyyx88GZFF1fOunH3-7cepKmtH4pxhtCoHqpWmT8YAmZxaewHgHAjLYsp1ZSe7zFYHj7C6ul7TjeLQeZD_YwD66t62wDmpe_HlB-TnBA-njbglfIsRLtXlnDzQkv5dTltRJ11BKBBypeeF6689rjcJIDEz9RWdc",
    dp: "BwKfV3Akq5_MFZDFZCnW-wzl-CCo83WoZvnLQwCTeDv8uzluRSnm71I3QCLdhrqE2e9YkxvuxdBfpT_PI7Yz-FOKnu1R6HsJeDCjn12Sk3vmAktV2zb34MCdy7cpdTh_YVr7tss2u6vneTwrA86rZtu5Mbr1C1XsmvkxHQAdYo0",
    dq: "h_96-mK1R_7glhsum81dZxjTnYynPbZpHziZjeeHcXYsXaaMwkOlODsWa7I9xXDoRwbKgB719rrmI2oKr6N3Do9U0ajaHF-NKJnwgjMd2w9cjz3_-kyNlxAr2v4IKhGNpmM5iIgOS1VZnOZ68m6_pbLBSp3nssTdlqvd0tIiTHU",
    qi: "IYd7DHOhrWvxkwPQsRM2tOgrjbcrfvtQJipd-DlcxyVuuM9sQLdgjVk2oy26F0EmpScGLq2MowX7fhd_QJQ3ydy5cY7YIBi87w93IKLEdfnbJtoOPLUW0ITrJReOgo1cq9SbsxYawBgfp_gh6A5603k2-ZQwVK0JKSHuLFkuQ3U",
  },
  signature: "cC4hiUPoj9Eetdgtv3hF80EGrhuB__dzERat0XF9g2VtQgr9PJbu3XOiZj5RZmh7AAuHIm4Bh-0Qc_lF5YKt_O8W2Fp5jujGbds9uJdbF9CUAr7t1dnZcAcQjbKBYNX4BAynRFdiuB--f_nZLgrnbyTyWzO75vRK5h6xBArLIARNPvkSjtQBMHlb1L07Qe7K0GarZRmB_eSN9383LcOLn6_dO--xi12jzDwusC-eOkHWEsqtFZESc6BfI7noOPqvhJ1phCnvWh6IeYI2w9QOYEUipUTI8np6LbgGY9Fs98rqVt5AXLIhWkWywlVmtVrBp0igcN_IoypGlUPQGe77Rw",
};
const ES256 = {
  input: `eyJhbGciOiJFUzI1NiJ9.${PAYLOAD}`,
  jwk: {
    kty: "EC",
    crv: "P-256",
    x: "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU",
    y: "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0",
    d: "jpsQnnGQmL-YBIffH1136cspYG6-0iY7X1fCE9-E9LI",
  },
  signature: "DtEhU3ljbEg8L38VWAfUAqOyKAM6-Xx-F4GawxaepmXFCgfTjDxw5djxLa8ISlSApmWQxfKTUJqPP3-Kg6NU1Q",
};
// RFC 8032 section 7.1, tests 1 to 3: secret key, public key, message, signature.
const ED25519 = [
  ["9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60", "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a", "",
    "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b"],
  ["4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb", "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c", "72",
    "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00"],
  ["c5aa8df43f9f837bedb7442f31dcb7b166d38535076f094b85ce3a2e0b4458f7", "fc51cd8e6218a1a38da47ed00230f0580816ed13ba3303ac5deb911548908025", "af82",
    "6291d657deec24024827e69c3abe01a30ce548a284743a445e3680d7db5ac3ac18ff9b538d16f290ae67f760984dc6594a7c15e9716ed28dc027beceea1ec40a"],
];

async function vectors() {
  const failures = [];
  const outputs = {};
  const standardOnly = {};
  let total = 0;
  const check = async (name, f) => {
    total++;
    try {
      await f();
    } catch (e) {
      failures.push({ name, error: `${errorName(e)}: ${e.message}` });
    }
  };
  const expect = (actual, expected, what) => {
    if (actual !== expected) throw new Error(`${what}: ${JSON.stringify(actual)}, expected ${JSON.stringify(expected)}`);
  };

  // FIPS 180-4's "abc".
  const digests = {
    "SHA-1": "a9993e364706816aba3e25717850c26c9cd0d89d",
    "SHA-256": "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
    "SHA-384": "cb00753f45a35e8bb5a03d699ac65007272c32ab0eded1631a8b605a43ff5bed8086072ba1e7cc2358baeca134c825a7",
    "SHA-512": "ddaf35a193617abacc417349ae20413112e6fa4e89a97ea20a9eeee64b55d39a2192992a274fc1a836ba3c23a3feebbd454d4423643ce80e2a9ac94fa54ca49f",
  };
  for (const [name, expected] of Object.entries(digests)) {
    await check(`digest ${name}`, async () => {
      expect(hex(await subtle.digest(name, utf8("abc"))), expected, name);
      expect(hex(await subtle.digest({ name: name.toLowerCase() }, new DataView(utf8("xabc").buffer, 1))), expected, `${name}, a view`);
    });
  }

  // RFC 4231 test case 2.
  await check("RFC 4231 case 2: HMAC-SHA-256", async () => {
    const key = await subtle.importKey("raw", utf8("Jefe"), { name: "HMAC", hash: "SHA-256" }, true, ["sign", "verify"]);
    const tag = await subtle.sign("HMAC", key, utf8("what do ya want for nothing?"));
    expect(hex(tag), "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843", "tag");
    expect(await subtle.verify("HMAC", key, tag, utf8("what do ya want for nothing?")), true, "verify");
    expect(await subtle.verify("HMAC", key, tag, utf8("what do ya want for nothing!")), false, "verify another message");
    expect(await subtle.verify("HMAC", key, tag.slice(0, 31), utf8("what do ya want for nothing?")), false, "a short tag");
    outputs.hmacJwk = await subtle.exportKey("jwk", key);
    outputs.hmacAlgorithm = key.algorithm;
  });

  await check("RFC 7515 A.1: HS256", async () => {
    const key = await subtle.importKey("jwk", HS256.jwk, { name: "HMAC", hash: "SHA-256" }, true, ["sign", "verify"]);
    expect(b64url(await subtle.sign("HMAC", key, utf8(HS256.input))), HS256.signature, "signature");
    expect(await subtle.verify({ name: "HMAC" }, key, fromB64url(HS256.signature), utf8(HS256.input)), true, "verify");
    const jwk = await subtle.exportKey("jwk", key);
    expect(jwk.k, HS256.jwk.k, "exported k");
    expect(jwk.alg, "HS256", "exported alg");
    expect(new Uint8Array(await subtle.exportKey("raw", key)).length, 64, "raw length");
  });

  await check("RFC 7515 A.2: RS256", async () => {
    const algorithm = { name: "RSASSA-PKCS1-v1_5", hash: "SHA-256" };
    const privateKey = await subtle.importKey("jwk", RS256.jwk, algorithm, true, ["sign"]);
    expect(b64url(await subtle.sign("RSASSA-PKCS1-v1_5", privateKey, utf8(RS256.input))), RS256.signature, "signature");
    const { n, e } = RS256.jwk;
    const publicKey = await subtle.importKey("jwk", { kty: "RSA", n, e }, algorithm, true, ["verify"]);
    expect(await subtle.verify("RSASSA-PKCS1-v1_5", publicKey, fromB64url(RS256.signature), utf8(RS256.input)), true, "verify");
    expect(await subtle.verify("RSASSA-PKCS1-v1_5", publicKey, fromB64url(RS256.signature), utf8(RS256.input + ".")), false, "verify another");
    const spki = await subtle.exportKey("spki", publicKey);
    const again = await subtle.importKey("spki", spki, algorithm, true, ["verify"]);
    expect(await subtle.verify("RSASSA-PKCS1-v1_5", again, fromB64url(RS256.signature), utf8(RS256.input)), true, "verify with the spki");
    const exported = await subtle.exportKey("jwk", publicKey);
    expect(exported.n, n, "exported n");
    expect(exported.alg, "RS256", "exported alg");
    const privateJwk = await subtle.exportKey("jwk", privateKey);
    expect(privateJwk.qi, RS256.jwk.qi, "exported qi");
    const pkcs8 = await subtle.exportKey("pkcs8", privateKey);
    const fromPkcs8 = await subtle.importKey("pkcs8", pkcs8, algorithm, true, ["sign"]);
    expect(b64url(await subtle.sign("RSASSA-PKCS1-v1_5", fromPkcs8, utf8(RS256.input))), RS256.signature, "signature with the pkcs8");
    outputs.rsa = [hex(spki), publicKey.algorithm.modulusLength, [...publicKey.algorithm.publicExponent], exported, privateJwk, hex(pkcs8)];
  });

  await check("RFC 7515 A.3: ES256", async () => {
    const algorithm = { name: "ECDSA", namedCurve: "P-256" };
    const { x, y } = ES256.jwk;
    const publicKey = await subtle.importKey("jwk", { kty: "EC", crv: "P-256", x, y }, algorithm, true, ["verify"]);
    const sign = { name: "ECDSA", hash: "SHA-256" };
    expect(await subtle.verify(sign, publicKey, fromB64url(ES256.signature), utf8(ES256.input)), true, "verify");
    expect(await subtle.verify(sign, publicKey, fromB64url(ES256.signature), utf8(ES256.input + ".")), false, "verify another");
    const privateKey = await subtle.importKey("jwk", ES256.jwk, algorithm, true, ["sign"]);
    const signature = await subtle.sign(sign, privateKey, utf8(ES256.input));
    expect(signature.byteLength, 64, "signature length");
    expect(await subtle.verify(sign, publicKey, signature, utf8(ES256.input)), true, "verify a new signature");
    const raw = await subtle.exportKey("raw", publicKey);
    expect(hex(raw), `04${hex(fromB64url(x))}${hex(fromB64url(y))}`, "raw");
    const spki = await subtle.exportKey("spki", publicKey);
    const fromSpki = await subtle.importKey("spki", spki, algorithm, true, ["verify"]);
    const fromRaw = await subtle.importKey("raw", raw, algorithm, true, ["verify"]);
    expect(await subtle.verify(sign, fromSpki, signature, utf8(ES256.input)), true, "verify with the spki");
    expect(await subtle.verify(sign, fromRaw, signature, utf8(ES256.input)), true, "verify with the raw key");
    // (Web Crypto's ECDSA JWKs have no alg, the hash not being the key's; Deno writes one: compared without.)
    const [{ alg: publicAlg, ...publicJwk }, { alg: privateAlg, ...privateJwk }] =
      [await subtle.exportKey("jwk", publicKey), await subtle.exportKey("jwk", privateKey)];
    standardOnly.ecJwkAlg = [publicAlg ?? null, privateAlg ?? null];
    const pkcs8 = await subtle.exportKey("pkcs8", privateKey);
    const fromPkcs8 = await subtle.importKey("pkcs8", pkcs8, algorithm, true, ["sign"]);
    expect((await subtle.exportKey("jwk", fromPkcs8)).d, ES256.jwk.d, "d from the pkcs8");
    outputs.ec = [hex(spki), publicJwk, privateJwk, publicKey.algorithm, hex(pkcs8)];
  });

  for (const [i, [secret, publicKey, message, signature]] of ED25519.entries()) {
    await check(`RFC 8032 7.1 test ${i + 1}: Ed25519`, async () => {
      const publicJwk = { kty: "OKP", crv: "Ed25519", x: b64url(fromHex(publicKey)) };
      const key = await subtle.importKey("raw", fromHex(publicKey), "Ed25519", true, ["verify"]);
      expect(await subtle.verify("Ed25519", key, fromHex(signature), fromHex(message)), true, "verify");
      expect(await subtle.verify("Ed25519", key, fromHex(signature), utf8("x")), false, "verify another");
      const privateKey = await subtle.importKey("jwk", { ...publicJwk, d: b64url(fromHex(secret)) }, { name: "Ed25519" }, true, ["sign"]);
      expect(hex(await subtle.sign("Ed25519", privateKey, fromHex(message))), signature, "signature");
      const spki = await subtle.exportKey("spki", key);
      expect(hex(spki), `302a300506032b6570032100${publicKey}`, "spki");
      const fromJwk = await subtle.importKey("jwk", publicJwk, "Ed25519", true, ["verify"]);
      expect(hex(await subtle.exportKey("raw", fromJwk)), publicKey, "raw");
      expect((await subtle.exportKey("jwk", privateKey)).d, b64url(fromHex(secret)), "exported d");
      const pkcs8 = await subtle.exportKey("pkcs8", privateKey);
      expect(hex(pkcs8), `302e020100300506032b657004220420${secret}`, "pkcs8");
      const fromPkcs8 = await subtle.importKey("pkcs8", pkcs8, "Ed25519", true, ["sign"]);
      expect(hex(await subtle.sign("Ed25519", fromPkcs8, fromHex(message))), signature, "signature with the pkcs8");
      outputs[`ed25519-${i + 1}`] = [await subtle.exportKey("jwk", key), key.algorithm, key.type, key.usages];
    });
  }
  return { total, failures, outputs, standardOnly };
}

// The keys this runtime makes, each with a signature of MESSAGE.
const MESSAGE = utf8("a message signed by one runtime and verified by another");
const EXPONENT = new Uint8Array([1, 0, 1]);
const KINDS = [
  ["ecdsa-p256", { name: "ECDSA", namedCurve: "P-256" }, { name: "ECDSA", hash: "SHA-256" }],
  ["ecdsa-p384", { name: "ECDSA", namedCurve: "P-384" }, { name: "ECDSA", hash: "SHA-384" }],
  ["ecdsa-p256-sha384", { name: "ECDSA", namedCurve: "P-256" }, { name: "ECDSA", hash: "SHA-384" }],
  ["ed25519", { name: "Ed25519" }, { name: "Ed25519" }],
  ["hmac-sha256", { name: "HMAC", hash: "SHA-256" }, { name: "HMAC" }],
  ["hmac-sha512", { name: "HMAC", hash: "SHA-512", length: 256 }, { name: "HMAC" }],
  ["rsa-pkcs1-sha256", { name: "RSASSA-PKCS1-v1_5", hash: "SHA-256", modulusLength: 2048, publicExponent: EXPONENT }, { name: "RSASSA-PKCS1-v1_5" }],
  ["rsa-pss-sha384", { name: "RSA-PSS", hash: "SHA-384", modulusLength: 2048, publicExponent: EXPONENT }, { name: "RSA-PSS", saltLength: 48 }],
  // A small old key: Portico verifies with it, and signs with none under 2,048 bits (nor with SHA-1).
  ["rsa-pkcs1-sha1-1024", { name: "RSASSA-PKCS1-v1_5", hash: "SHA-1", modulusLength: 1024, publicExponent: EXPONENT }, { name: "RSASSA-PKCS1-v1_5" }],
  // A fixed key both runtimes have (Portico makes no RSA keys): RFC 7515 A.2's, with other hashes.
  ["rsa-pkcs1-sha512-rfc7515", { name: "RSASSA-PKCS1-v1_5", hash: "SHA-512" }, { name: "RSASSA-PKCS1-v1_5" }, RS256.jwk],
  ["rsa-pss-sha256-rfc7515", { name: "RSA-PSS", hash: "SHA-256" }, { name: "RSA-PSS", saltLength: 32 }, RS256.jwk],
];
const DETERMINISTIC = (id) => id.startsWith("ed25519") || id.startsWith("hmac") || id.startsWith("rsa-pkcs1");
// The algorithm to import a key of this kind with (generateKey's, less what only generation takes).
const importAlgorithm = (algorithm) => {
  const { modulusLength, publicExponent, length, ...rest } = algorithm;
  return rest;
};

async function keys() {
  const out = [];
  for (const [id, algorithm, signing, jwk] of KINDS) {
    let pair, signature;
    try {
      if (jwk) pair = { privateKey: await subtle.importKey("jwk", jwk, algorithm, true, ["sign"]) };
      else pair = await subtle.generateKey(algorithm, true, ["sign", "verify"]);
      signature = b64url(await subtle.sign(signing, pair instanceof CryptoKey ? pair : pair.privateKey, MESSAGE));
    } catch (e) {
      out.push({ id, unsupported: errorName(e) });
      continue;
    }
    const secret = pair instanceof CryptoKey;
    const entry = { id, algorithm: importAlgorithm(algorithm), signing, signature };
    const exported = async (format, key) => {
      try {
        const data = await subtle.exportKey(format, key);
        return format === "jwk" ? data : b64url(data);
      } catch (e) {
        return undefined; // a format this runtime does not export the key in
      }
    };
    if (secret) {
      entry.raw = await exported("raw", pair);
      entry.jwk = await exported("jwk", pair);
    } else {
      entry.pkcs8 = await exported("pkcs8", pair.privateKey);
      entry.privateJwk = await exported("jwk", pair.privateKey);
      if (pair.publicKey) {
        entry.spki = await exported("spki", pair.publicKey);
        entry.publicJwk = await exported("jwk", pair.publicKey);
        if (!id.startsWith("rsa")) entry.raw = await exported("raw", pair.publicKey);
      } else {
        // An imported private key: its public half from its JWK.
        const { kty, n, e, crv, x, y } = entry.privateJwk;
        entry.publicJwk = { kty, n, e, crv, x, y };
      }
    }
    out.push(entry);
  }
  return out;
}

async function checkKeys(entries) {
  const checks = {};
  const signatures = {};
  for (const entry of entries) {
    const { id, algorithm, signing } = entry;
    if (entry.unsupported) continue;
    const signature = fromB64url(entry.signature);
    const other = utf8("another message");
    if (id.startsWith("hmac")) {
      for (const format of ["raw", "jwk"]) {
        if (entry[format] === undefined) continue;
        checks[`${id} ${format}`] = await outcome(async () => {
          const data = format === "jwk" ? entry.jwk : fromB64url(entry.raw);
          const key = await subtle.importKey(format, data, algorithm, false, ["sign", "verify"]);
          const same = b64url(await subtle.sign(signing, key, MESSAGE)) === entry.signature;
          return same && (await subtle.verify(signing, key, signature, MESSAGE)) && !(await subtle.verify(signing, key, signature, other));
        });
      }
      continue;
    }
    for (const format of ["spki", "publicJwk", "raw"]) {
      if (entry[format] === undefined) continue;
      checks[`${id} verify with ${format}`] = await outcome(async () => {
        const data = format === "publicJwk" ? entry.publicJwk : fromB64url(entry[format]);
        const key = await subtle.importKey(format === "publicJwk" ? "jwk" : format, data, algorithm, false, ["verify"]);
        return (await subtle.verify(signing, key, signature, MESSAGE)) && !(await subtle.verify(signing, key, signature, other));
      });
    }
    signatures[id] = {};
    for (const format of ["pkcs8", "privateJwk"]) {
      if (entry[format] === undefined) continue;
      checks[`${id} sign with ${format}`] = await outcome(async () => {
        const data = format === "privateJwk" ? entry.privateJwk : fromB64url(entry[format]);
        const key = await subtle.importKey(format === "privateJwk" ? "jwk" : format, data, algorithm, false, ["sign"]);
        const mine = b64url(await subtle.sign(signing, key, MESSAGE));
        signatures[id][format] = mine;
        // The same signature where the algorithm gives one only.
        return !DETERMINISTIC(id) || mine === entry.signature;
      });
    }
  }
  return { checks, signatures };
}

async function verifySignatures({ keys, signatures }) {
  const out = {};
  for (const entry of keys) {
    for (const [format, signature] of Object.entries(signatures[entry.id] ?? {})) {
      out[`${entry.id} signed with ${format}`] = await outcome(async () => {
        const key = await subtle.importKey("jwk", entry.publicJwk, entry.algorithm, false, ["verify"]);
        return subtle.verify(entry.signing, key, fromB64url(signature), MESSAGE);
      });
    }
  }
  return out;
}

// What misuses throw.
async function errors() {
  const hmacKey = await subtle.importKey("raw", utf8("key"), { name: "HMAC", hash: "SHA-256" }, false, ["sign"]);
  const ec = await subtle.importKey("jwk", ES256.jwk, { name: "ECDSA", namedCurve: "P-256" }, false, ["sign"]);
  const { x, y } = ES256.jwk;
  const ecPublic = await subtle.importKey("jwk", { kty: "EC", crv: "P-256", x, y }, { name: "ECDSA", namedCurve: "P-256" }, true, ["verify"]);
  const ecSpki = await subtle.exportKey("spki", ecPublic);
  const ed = await subtle.importKey("raw", fromHex(ED25519[0][1]), "Ed25519", true, ["verify"]);
  const rsaPublic = await subtle.importKey("jwk", { kty: "RSA", n: RS256.jwk.n, e: "AQAB" }, { name: "RSA-PSS", hash: "SHA-256" }, true, ["verify"]);
  const hmac = { name: "HMAC", hash: "SHA-256" };
  const rsaPkcs8 = await subtle.exportKey("pkcs8", await subtle.importKey("jwk", RS256.jwk, { name: "RSA-PSS", hash: "SHA-256" }, true, ["sign"]));
  const cases = {
    "spki truncated": () => subtle.importKey("spki", ecSpki.slice(0, 40), { name: "ECDSA", namedCurve: "P-256" }, true, ["verify"]),
    "pkcs8 truncated": () => subtle.importKey("pkcs8", rsaPkcs8.slice(0, 600), { name: "RSA-PSS", hash: "SHA-256" }, true, ["sign"]),
    "pkcs8 of RSA as ECDSA": () => subtle.importKey("pkcs8", rsaPkcs8, { name: "ECDSA", namedCurve: "P-256" }, true, ["sign"]),
    "jwk n not base64url": () => subtle.importKey("jwk", { kty: "RSA", n: "!!", e: "AQAB" }, { name: "RSA-PSS", hash: "SHA-256" }, true, ["verify"]),
    "jwk without e": () => subtle.importKey("jwk", { kty: "RSA", n: RS256.jwk.n }, { name: "RSA-PSS", hash: "SHA-256" }, true, ["verify"]),
    "unknown algorithm": () => subtle.importKey("raw", utf8("k"), "AES-XYZ", false, ["sign"]),
    "HMAC without hash": () => subtle.importKey("raw", utf8("k"), { name: "HMAC" }, false, ["sign"]),
    "HMAC usage encrypt": () => subtle.importKey("raw", utf8("k"), hmac, false, ["encrypt"]),
    "HMAC no usage": () => subtle.importKey("raw", utf8("k"), hmac, false, []),
    "HMAC bogus usage": () => subtle.importKey("raw", utf8("k"), hmac, false, ["bogus"]),
    "HMAC empty key": () => subtle.importKey("raw", new Uint8Array(0), hmac, false, ["sign"]),
    "HMAC length too long": () => subtle.importKey("raw", utf8("k"), { ...hmac, length: 16 }, false, ["sign"]),
    "HMAC jwk alg": () => subtle.importKey("jwk", { ...HS256.jwk, alg: "HS256" }, { name: "HMAC", hash: "SHA-512" }, false, ["sign"]),
    "HMAC jwk kty": () => subtle.importKey("jwk", { ...HS256.jwk, kty: "EC" }, hmac, false, ["sign"]),
    "HMAC jwk use": () => subtle.importKey("jwk", { ...HS256.jwk, use: "enc" }, hmac, false, ["sign"]),
    "HMAC jwk key_ops": () => subtle.importKey("jwk", { ...HS256.jwk, key_ops: ["verify"] }, hmac, false, ["sign"]),
    "HMAC jwk ext": () => subtle.importKey("jwk", { ...HS256.jwk, ext: false }, hmac, true, ["sign"]),
    "HMAC spki": () => subtle.importKey("spki", ecSpki, hmac, false, ["sign"]),
    "bogus format": () => subtle.importKey("bogus", utf8("k"), hmac, false, ["sign"]),
    "jwk not an object": () => subtle.importKey("jwk", "text", hmac, false, ["sign"]),
    "raw not a buffer": () => subtle.importKey("raw", "text", hmac, false, ["sign"]),
    "spki garbage": () => subtle.importKey("spki", utf8("garbage"), { name: "ECDSA", namedCurve: "P-256" }, true, ["verify"]),
    "spki other curve": () => subtle.importKey("spki", ecSpki, { name: "ECDSA", namedCurve: "P-384" }, true, ["verify"]),
    "spki other algorithm": () => subtle.importKey("spki", ecSpki, "Ed25519", true, ["verify"]),
    "ECDSA without curve": () => subtle.importKey("spki", ecSpki, { name: "ECDSA" }, true, ["verify"]),
    "ECDSA public key to sign": () => subtle.importKey("spki", ecSpki, { name: "ECDSA", namedCurve: "P-256" }, true, ["sign"]),
    "ECDSA raw of the wrong length": () => subtle.importKey("raw", new Uint8Array(64), { name: "ECDSA", namedCurve: "P-256" }, true, ["verify"]),
    "EC jwk as Ed25519": () => subtle.importKey("jwk", ES256.jwk, "Ed25519", true, ["sign"]),
    "EC jwk crv": () => subtle.importKey("jwk", ES256.jwk, { name: "ECDSA", namedCurve: "P-384" }, true, ["sign"]),
    "EC jwk alg": () => subtle.importKey("jwk", { ...ES256.jwk, alg: "ES384" }, { name: "ECDSA", namedCurve: "P-256" }, true, ["sign"]),
    "RSA jwk alg": () => subtle.importKey("jwk", { ...RS256.jwk, alg: "RS256" }, { name: "RSA-PSS", hash: "SHA-256" }, true, ["sign"]),
    "RSA raw": () => subtle.importKey("raw", utf8("k"), { name: "RSA-PSS", hash: "SHA-256" }, true, ["verify"]),
    "Ed25519 pkcs8 garbage": () => subtle.importKey("pkcs8", utf8("garbage"), "Ed25519", true, ["sign"]),
    "Ed25519 raw private usage": () => subtle.importKey("raw", fromHex(ED25519[0][1]), "Ed25519", true, ["sign"]),
    "Ed25519 raw of 31 bytes": () => subtle.importKey("raw", new Uint8Array(31), "Ed25519", true, ["verify"]),
    "sign with another algorithm": () => subtle.sign("HMAC", ec, MESSAGE),
    "sign with a public key": () => subtle.sign({ name: "ECDSA", hash: "SHA-256" }, ecPublic, MESSAGE),
    "verify with a private key": () => subtle.verify({ name: "ECDSA", hash: "SHA-256" }, ec, new Uint8Array(64), MESSAGE),
    "verify without the usage": () => subtle.verify("HMAC", hmacKey, new Uint8Array(32), MESSAGE),
    "sign with no key": () => subtle.sign("HMAC", {}, MESSAGE),
    "sign ECDSA without hash": () => subtle.sign({ name: "ECDSA" }, ec, MESSAGE),
    "RSA-PSS without saltLength": () => subtle.verify({ name: "RSA-PSS" }, rsaPublic, new Uint8Array(256), MESSAGE),
    "verify a short signature": () => subtle.verify("Ed25519", ed, new Uint8Array(10), MESSAGE),
    "verify a short ECDSA signature": () => subtle.verify({ name: "ECDSA", hash: "SHA-256" }, ecPublic, new Uint8Array(10), MESSAGE),
    "export not extractable": () => subtle.exportKey("raw", hmacKey),
    "export a public key as pkcs8": () => subtle.exportKey("pkcs8", ecPublic),
    "export an RSA key as raw": () => subtle.exportKey("raw", rsaPublic),
    "export HMAC as spki": () => subtle.exportKey("spki", hmacKey),
    "export no key": () => subtle.exportKey("raw", {}),
    "digest MD5": () => subtle.digest("MD5", MESSAGE),
    "digest HMAC": () => subtle.digest("HMAC", MESSAGE),
    "digest a string": () => subtle.digest("SHA-256", "text"),
    "digest no algorithm name": () => subtle.digest({}, MESSAGE),
    "generate HMAC no usage": () => subtle.generateKey(hmac, true, []),
    "generate ECDSA verify only": () => subtle.generateKey({ name: "ECDSA", namedCurve: "P-256" }, true, ["verify"]),
    "generate ECDSA encrypt": () => subtle.generateKey({ name: "ECDSA", namedCurve: "P-256" }, true, ["sign", "encrypt"]),
    "generate HMAC of 0 bits": () => subtle.generateKey({ ...hmac, length: 0 }, true, ["sign"]),
  };
  const out = {};
  for (const [name, f] of Object.entries(cases)) {
    try {
      const value = await f();
      out[name] = typeof value === "boolean" ? value : "ok";
    } catch (e) {
      out[name] = errorName(e);
    }
  }
  const sync = {
    "new CryptoKey": () => new CryptoKey(),
    "new SubtleCrypto": () => new SubtleCrypto(),
    "getRandomValues Float32Array": () => crypto.getRandomValues(new Float32Array(1)),
    "getRandomValues too many": () => crypto.getRandomValues(new Uint8Array(65537)),
    "getRandomValues DataView": () => crypto.getRandomValues(new DataView(new ArrayBuffer(4))),
  };
  for (const [name, f] of Object.entries(sync)) {
    try {
      f();
      out[name] = "ok";
    } catch (e) {
      out[name] = errorName(e);
    }
  }
  // Not a promise, but a rejected one: a misuse never throws synchronously.
  out["rejects, not throws"] = await (async () => {
    let promise;
    try {
      promise = subtle.digest("MD5", MESSAGE);
    } catch {
      return "threw";
    }
    return promise.then(() => "resolved", (e) => `rejected ${errorName(e)}`);
  })();
  out.shapes = [Object.prototype.toString.call(crypto), Object.prototype.toString.call(subtle),
    Object.prototype.toString.call(ec), ec.type, ec.extractable, ec.usages, ec.algorithm, hmacKey.algorithm,
    rsaPublic.algorithm.name, rsaPublic.algorithm.modulusLength, crypto.getRandomValues(new Uint8Array(8)).length,
    crypto.getRandomValues(new BigInt64Array(2)).length];
  return out;
}

// Bytes of every shape imported as every format of every algorithm: each a DataError (or the SyntaxError or
// NotSupportedError the format and usage give before the bytes are read), never anything else.
async function hostile() {
  let seed = 7;
  const random = () => (seed = (seed * 1103515245 + 12345) >>> 0) >>> 16;
  const inputs = [new Uint8Array(0), new Uint8Array(1), new Uint8Array(65).fill(4), new Uint8Array(32).fill(0xff)];
  for (let i = 0; i < 40; i++) inputs.push(new Uint8Array(random() % 300).map(() => random() & 0xff));
  // DER-looking ones: a SEQUENCE header with a length past the end, nested sequences, an OID.
  inputs.push(new Uint8Array([0x30, 0x84, 0xff, 0xff, 0xff, 0xff]), new Uint8Array([0x30, 0x03, 0x30, 0x01, 0x30]),
    new Uint8Array([0x30, 0x0b, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x02, 0x00, 0x01]));
  const algorithms = [{ name: "ECDSA", namedCurve: "P-256" }, { name: "ECDSA", namedCurve: "P-384" }, { name: "Ed25519" },
    { name: "RSASSA-PKCS1-v1_5", hash: "SHA-256" }, { name: "RSA-PSS", hash: "SHA-512" }];
  const outcomes = {};
  for (const algorithm of algorithms) {
    for (const [format, usage] of [["spki", "verify"], ["raw", "verify"], ["pkcs8", "sign"]]) {
      for (const input of inputs) {
        // (The standard imports any 32 bytes as an Ed25519 public key: a bad point fails to verify.)
        if (algorithm.name === "Ed25519" && format === "raw" && input.length === 32) continue;
        let got;
        try {
          await subtle.importKey(format, input, algorithm, false, [usage]);
          got = "ok";
        } catch (e) {
          got = errorName(e);
        }
        outcomes[got] = (outcomes[got] ?? 0) + 1;
      }
    }
  }
  return outcomes;
}

export default {
  async fetch(request) {
    const path = new URL(request.url).pathname.replace(/^.*\//, "/"); // (the last segment: Portico routes on a prefix)
    if (path === "/vectors") return Response.json(await vectors());
    if (path === "/keys") return Response.json(await keys());
    if (path === "/check") return Response.json(await checkKeys(await request.json()));
    if (path === "/verify") return Response.json(await verifySignatures(await request.json()));
    if (path === "/errors") return Response.json(await errors());
    if (path === "/hostile") return Response.json(await hostile());
    return new Response("not found\n", { status: 404 });
  },
};
