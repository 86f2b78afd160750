// The Encoding Standard's handler of tests/functions_webapi.rs, run by Portico and by Deno (`deno serve`).
//
// GET /wpt: the cases of web-platform-tests' encoding/ suite ported here (api-basics, textdecoder-fatal,
// textdecoder-fatal-single-byte, textdecoder-ignorebom, textdecoder-streaming, textdecoder-eof,
// textdecoder-copy, textencoder-constructor-non-utf, textencoder-utf16-surrogates, encodeInto, api-invalid-label,
// api-replacement-encodings and the streams/ tests), each run and answered as { total, failures: [{ name,
// error }] }.
// POST /labels with encoding-labels.json (the standard's table of encodings and labels): every label, in any
// case and between whitespace, names its encoding; { total, failures }.
// GET /observe: what decoding and encoding give on fixed inputs in every encoding, as JSON, to compare with Deno.
// POST /pipe?encoding=LABEL: the body decoded, upper-cased and encoded in UTF-8 as it streams through.

const show = (value) => {
  if (typeof value === "string") return JSON.stringify(value);
  if (value instanceof Uint8Array || Array.isArray(value)) return `[${[...value].join(",")}]`;
  return String(value);
};
const assertEquals = (actual, expected, what = "") => {
  if (!Object.is(actual, expected)) throw new Error(`${what} ${show(actual)}, expected ${show(expected)}`.trim());
};
const assertArrayEquals = (actual, expected, what = "") => {
  if (actual.length !== expected.length || [...actual].some((v, i) => v !== expected[i])) {
    throw new Error(`${what} ${show(actual)}, expected ${show(expected)}`.trim());
  }
};
const assertThrows = (Type, f, what = "") => {
  try {
    f();
  } catch (e) {
    if (!(e instanceof Type)) throw new Error(`${what} threw ${e}, not a ${Type.name}`.trim());
    return;
  }
  throw new Error(`${what} did not throw`.trim());
};
const assertRejects = async (Type, promise, what = "") => {
  try {
    await promise;
  } catch (e) {
    if (!(e instanceof Type)) throw new Error(`${what} rejected with ${e}, not a ${Type.name}`.trim());
    return;
  }
  throw new Error(`${what} did not reject`.trim());
};

class Suite {
  tests = [];
  test(name, f) { this.tests.push([name, f]); }
  async run() {
    const failures = [];
    for (const [name, f] of this.tests) {
      try {
        await f();
      } catch (e) {
        failures.push({ name, error: e instanceof Error ? `${e.name}: ${e.message}` : String(e) });
      }
    }
    return { total: this.tests.length, failures };
  }
}

const bytes = (list) => new Uint8Array(list);
const shared = typeof SharedArrayBuffer === "function";
// A Uint8Array of the bytes on an ArrayBuffer or a SharedArrayBuffer.
const onBuffer = (kind, list) => {
  const buffer = kind === "SharedArrayBuffer" ? new SharedArrayBuffer(list.length) : new ArrayBuffer(list.length);
  const view = new Uint8Array(buffer);
  view.set(list);
  return view;
};
const BUFFERS = shared ? ["ArrayBuffer", "SharedArrayBuffer"] : ["ArrayBuffer"];

const readAll = async (readable) => {
  const out = [];
  const reader = readable.getReader();
  for (;;) {
    const { done, value } = await reader.read();
    if (done) return out;
    out.push(value);
  }
};
const streamOf = (chunks) => new ReadableStream({
  start(controller) {
    for (const chunk of chunks) controller.enqueue(chunk);
    controller.close();
  },
});

function wpt() {
  const s = new Suite();

  // api-basics
  s.test("api-basics: defaults", () => {
    assertEquals(new TextEncoder().encoding, "utf-8");
    assertEquals(new TextDecoder().encoding, "utf-8");
    assertEquals(typeof new TextEncoder().encode, "function");
    assertEquals(typeof new TextDecoder().decode, "function");
    assertArrayEquals(new TextEncoder().encode(), []);
    assertArrayEquals(new TextEncoder().encode(undefined), []);
    assertEquals(new TextDecoder().fatal, false);
    assertEquals(new TextDecoder().ignoreBOM, false);
    assertEquals(new TextDecoder().decode(), "");
  });
  // z, cent, CJK water, G clef, PUA, PUA (non-BMP), U+FFFE
  const sample = "z\xA2\u6C34\uD834\uDD1E\uF8FF\uDBFF\uDFFD\uFFFE";
  const samples = {
    "utf-8": [0x7A, 0xC2, 0xA2, 0xE6, 0xB0, 0xB4, 0xF0, 0x9D, 0x84, 0x9E, 0xEF, 0xA3, 0xBF, 0xF4, 0x8F, 0xBF, 0xBD, 0xEF, 0xBF, 0xBE],
    "utf-16le": [0x7A, 0x00, 0xA2, 0x00, 0x34, 0x6C, 0x34, 0xD8, 0x1E, 0xDD, 0xFF, 0xF8, 0xFF, 0xDB, 0xFD, 0xDF, 0xFE, 0xFF],
    "utf-16be": [0x00, 0x7A, 0x00, 0xA2, 0x6C, 0x34, 0xD8, 0x34, 0xDD, 0x1E, 0xF8, 0xFF, 0xDB, 0xFF, 0xDF, 0xFD, 0xFF, 0xFE],
    "utf-16": [0x7A, 0x00, 0xA2, 0x00, 0x34, 0x6C, 0x34, 0xD8, 0x1E, 0xDD, 0xFF, 0xF8, 0xFF, 0xDB, 0xFD, 0xDF, 0xFE, 0xFF],
  };
  for (const [encoding, encoded] of Object.entries(samples)) {
    s.test(`api-basics: ${encoding} sample`, () => {
      if (encoding === "utf-8") assertArrayEquals(new TextEncoder(encoding).encode(sample), encoded, "encode");
      assertEquals(new TextDecoder(encoding).decode(bytes(encoded)), sample, "decode of a view");
      assertEquals(new TextDecoder(encoding).decode(bytes(encoded).buffer), sample, "decode of a buffer");
    });
  }

  // textdecoder-fatal
  const bad = [
    ["utf-8", [0xFF], "invalid code"],
    ["utf-8", [0xC0], "ends early"],
    ["utf-8", [0xE0], "ends early 2"],
    ["utf-8", [0xC0, 0x00], "invalid trail"],
    ["utf-8", [0xC0, 0xC0], "invalid trail 2"],
    ["utf-8", [0xE0, 0x00], "invalid trail 3"],
    ["utf-8", [0xE0, 0xC0], "invalid trail 4"],
    ["utf-8", [0xE0, 0x80, 0x00], "invalid trail 5"],
    ["utf-8", [0xE0, 0x80, 0xC0], "invalid trail 6"],
    ["utf-8", [0xFC, 0x80, 0x80, 0x80, 0x80, 0x80], "> 0x10FFFF"],
    ["utf-8", [0xFE, 0x80, 0x80, 0x80, 0x80, 0x80], "obsolete lead byte"],
    ["utf-8", [0xC0, 0x80], "overlong U+0000 - 2 bytes"],
    ["utf-8", [0xE0, 0x80, 0x80], "overlong U+0000 - 3 bytes"],
    ["utf-8", [0xF0, 0x80, 0x80, 0x80], "overlong U+0000 - 4 bytes"],
    ["utf-8", [0xF8, 0x80, 0x80, 0x80, 0x80], "overlong U+0000 - 5 bytes"],
    ["utf-8", [0xFC, 0x80, 0x80, 0x80, 0x80, 0x80], "overlong U+0000 - 6 bytes"],
    ["utf-8", [0xC1, 0xBF], "overlong U+007F - 2 bytes"],
    ["utf-8", [0xE0, 0x81, 0xBF], "overlong U+007F - 3 bytes"],
    ["utf-8", [0xF0, 0x80, 0x81, 0xBF], "overlong U+007F - 4 bytes"],
    ["utf-8", [0xF8, 0x80, 0x80, 0x81, 0xBF], "overlong U+007F - 5 bytes"],
    ["utf-8", [0xFC, 0x80, 0x80, 0x80, 0x81, 0xBF], "overlong U+007F - 6 bytes"],
    ["utf-8", [0xE0, 0x9F, 0xBF], "overlong U+07FF - 3 bytes"],
    ["utf-8", [0xF0, 0x80, 0x9F, 0xBF], "overlong U+07FF - 4 bytes"],
    ["utf-8", [0xF8, 0x80, 0x80, 0x9F, 0xBF], "overlong U+07FF - 5 bytes"],
    ["utf-8", [0xFC, 0x80, 0x80, 0x80, 0x9F, 0xBF], "overlong U+07FF - 6 bytes"],
    ["utf-8", [0xF0, 0x8F, 0xBF, 0xBF], "overlong U+FFFF - 4 bytes"],
    ["utf-8", [0xF8, 0x80, 0x8F, 0xBF, 0xBF], "overlong U+FFFF - 5 bytes"],
    ["utf-8", [0xFC, 0x80, 0x80, 0x8F, 0xBF, 0xBF], "overlong U+FFFF - 6 bytes"],
    ["utf-8", [0xF8, 0x84, 0x8F, 0xBF, 0xBF], "overlong U+10FFFF - 5 bytes"],
    ["utf-8", [0xFC, 0x80, 0x84, 0x8F, 0xBF, 0xBF], "overlong U+10FFFF - 6 bytes"],
    ["utf-8", [0xED, 0xA0, 0x80], "lead surrogate"],
    ["utf-8", [0xED, 0xB0, 0x80], "trail surrogate"],
    ["utf-8", [0xED, 0xA0, 0x80, 0xED, 0xB0, 0x80], "surrogate pair"],
    ["utf-16le", [0x00], "truncated code unit"],
  ];
  for (const [encoding, input, name] of bad) {
    s.test(`textdecoder-fatal: ${encoding} - ${name}`, () => {
      assertThrows(TypeError, () => new TextDecoder(encoding, { fatal: true }).decode(bytes(input)));
      // Without fatal, the same bytes decode with replacements.
      assertEquals(typeof new TextDecoder(encoding).decode(bytes(input)), "string");
    });
  }
  s.test("textdecoder-fatal: the fatal attribute", () => {
    assertEquals(typeof new TextDecoder().fatal, "boolean");
    assertEquals(new TextDecoder().fatal, false);
    assertEquals(new TextDecoder("utf-8", { fatal: true }).fatal, true);
  });
  s.test("textdecoder-fatal: an error does not prevent later decodes", () => {
    const heart = bytes([226, 153, 165]);
    const decoder = new TextDecoder("utf-8", { fatal: true });
    assertEquals(decoder.decode(new DataView(heart.buffer, 0, 3)), "\u2665");
    assertThrows(TypeError, () => decoder.decode(new DataView(heart.buffer, 0, 2)));
    assertEquals(decoder.decode(new DataView(heart.buffer, 0, 3)), "\u2665");
  });
  s.test("textdecoder-fatal-streaming: unterminated sequences throw at the end", () => {
    for (const [encoding, sequence] of [["utf-8", [0xC0]], ["utf-16le", [0x00]], ["utf-16be", [0x00]]]) {
      assertThrows(TypeError, () => new TextDecoder(encoding, { fatal: true }).decode(bytes(sequence)), encoding);
    }
    for (const encoding of ["utf-8", "utf-16le"]) {
      const decoder = new TextDecoder(encoding, { fatal: true });
      assertEquals(decoder.decode(bytes([encoding === "utf-8" ? 0xE2 : 0x00]), { stream: true }), "", encoding);
      assertThrows(TypeError, () => decoder.decode(), `${encoding} at the end`);
    }
  });
  s.test("textdecoder-fatal-streaming: utf-16le", () => {
    const decoder = new TextDecoder("utf-16le", { fatal: true });
    const odd = bytes([0x00]), even = bytes([0x00, 0x00]);
    assertEquals(decoder.decode(odd, { stream: true }), "");
    assertEquals(decoder.decode(odd), "\u0000");
    assertThrows(TypeError, () => { decoder.decode(even, { stream: true }); decoder.decode(odd); });
    assertThrows(TypeError, () => { decoder.decode(odd, { stream: true }); decoder.decode(even); });
    assertEquals(decoder.decode(even, { stream: true }), "\u0000");
    assertEquals(decoder.decode(even), "\u0000");
  });

  // textdecoder-fatal-single-byte: each encoding's bytes without a code point throw with fatal.
  const singleByte = {
    "IBM866": [], "ISO-8859-2": [], "ISO-8859-3": [0xA5, 0xAE, 0xBE, 0xC3, 0xD0, 0xE3, 0xF0], "ISO-8859-4": [],
    "ISO-8859-5": [],
    "ISO-8859-6": [0xA1, 0xA2, 0xA3, 0xA5, 0xA6, 0xA7, 0xA8, 0xA9, 0xAA, 0xAB, 0xAE, 0xAF, 0xB0, 0xB1, 0xB2, 0xB3,
      0xB4, 0xB5, 0xB6, 0xB7, 0xB8, 0xB9, 0xBA, 0xBC, 0xBD, 0xBE, 0xC0, 0xDB, 0xDC, 0xDD, 0xDE, 0xDF, 0xF3, 0xF4, 0xF5,
      0xF6, 0xF7, 0xF8, 0xF9, 0xFA, 0xFB, 0xFC, 0xFD, 0xFE, 0xFF],
    "ISO-8859-7": [0xAE, 0xD2, 0xFF],
    "ISO-8859-8": [0xA1, 0xBF, 0xC0, 0xC1, 0xC2, 0xC3, 0xC4, 0xC5, 0xC6, 0xC7, 0xC8, 0xC9, 0xCA, 0xCB, 0xCC, 0xCD, 0xCE,
      0xCF, 0xD0, 0xD1, 0xD2, 0xD3, 0xD4, 0xD5, 0xD6, 0xD7, 0xD8, 0xD9, 0xDA, 0xDB, 0xDC, 0xDD, 0xDE, 0xFB, 0xFC, 0xFF],
    "ISO-8859-8-I": [0xA1, 0xBF, 0xC0, 0xC1, 0xC2, 0xC3, 0xC4, 0xC5, 0xC6, 0xC7, 0xC8, 0xC9, 0xCA, 0xCB, 0xCC, 0xCD,
      0xCE, 0xCF, 0xD0, 0xD1, 0xD2, 0xD3, 0xD4, 0xD5, 0xD6, 0xD7, 0xD8, 0xD9, 0xDA, 0xDB, 0xDC, 0xDD, 0xDE, 0xFB, 0xFC,
      0xFF],
    "ISO-8859-10": [], "ISO-8859-13": [], "ISO-8859-14": [], "ISO-8859-15": [], "ISO-8859-16": [], "KOI8-R": [],
    "KOI8-U": [], "macintosh": [], "windows-874": [0xDB, 0xDC, 0xDD, 0xDE, 0xFC, 0xFD, 0xFE, 0xFF],
    "windows-1250": [], "windows-1251": [], "windows-1252": [], "windows-1253": [0xAA, 0xD2, 0xFF],
    "windows-1254": [], "windows-1255": [0xD9, 0xDA, 0xDB, 0xDC, 0xDD, 0xDE, 0xDF, 0xFB, 0xFC, 0xFF],
    "windows-1256": [], "windows-1257": [0xA1, 0xA5], "windows-1258": [], "x-mac-cyrillic": [],
  };
  for (const [encoding, missing] of Object.entries(singleByte)) {
    s.test(`textdecoder-fatal-single-byte: ${encoding}`, () => {
      for (let i = 0; i < 256; i++) {
        const decode = () => new TextDecoder(encoding, { fatal: true }).decode(bytes([i]));
        if (missing.includes(i)) assertThrows(TypeError, decode, `byte ${i}`);
        else assertEquals(typeof decode(), "string", `byte ${i}`);
      }
    });
  }

  // textdecoder-ignorebom
  const boms = {
    "utf-8": [0xEF, 0xBB, 0xBF, 0x61, 0x62, 0x63],
    "utf-16le": [0xFF, 0xFE, 0x61, 0x00, 0x62, 0x00, 0x63, 0x00],
    "utf-16be": [0xFE, 0xFF, 0x00, 0x61, 0x00, 0x62, 0x00, 0x63],
  };
  for (const [encoding, encoded] of Object.entries(boms)) {
    s.test(`textdecoder-ignorebom: ${encoding}`, () => {
      assertEquals(new TextDecoder(encoding, { ignoreBOM: true }).decode(bytes(encoded)), "\uFEFFabc", "ignoreBOM");
      assertEquals(new TextDecoder(encoding, { ignoreBOM: false }).decode(bytes(encoded)), "abc", "no ignoreBOM");
      assertEquals(new TextDecoder(encoding).decode(bytes(encoded)), "abc", "default");
      // Only the stream's first BOM is removed: one split between chunks too, and each new stream's.
      const decoder = new TextDecoder(encoding);
      let out = "";
      for (const b of [...encoded, ...encoded]) out += decoder.decode(bytes([b]), { stream: true });
      out += decoder.decode();
      assertEquals(out, "abc\uFEFFabc", "streamed");
      assertEquals(decoder.decode(bytes(encoded)), "abc", "a new stream");
    });
  }
  s.test("textdecoder-ignorebom: the ignoreBOM attribute", () => {
    assertEquals(typeof new TextDecoder().ignoreBOM, "boolean");
    assertEquals(new TextDecoder("utf-8", { ignoreBOM: true }).ignoreBOM, true);
  });

  // textdecoder-streaming
  const string = "\x00123ABCabc\x80\xFF\u0100\u1000\uFFFD\uD800\uDC00\uDBFF\uDFFF";
  const octets = {
    "utf-8": [0x00, 0x31, 0x32, 0x33, 0x41, 0x42, 0x43, 0x61, 0x62, 0x63, 0xc2, 0x80, 0xc3, 0xbf, 0xc4, 0x80, 0xe1,
      0x80, 0x80, 0xef, 0xbf, 0xbd, 0xf0, 0x90, 0x80, 0x80, 0xf4, 0x8f, 0xbf, 0xbf],
    "utf-16le": [0x00, 0x00, 0x31, 0x00, 0x32, 0x00, 0x33, 0x00, 0x41, 0x00, 0x42, 0x00, 0x43, 0x00, 0x61, 0x00, 0x62,
      0x00, 0x63, 0x00, 0x80, 0x00, 0xFF, 0x00, 0x00, 0x01, 0x00, 0x10, 0xFD, 0xFF, 0x00, 0xD8, 0x00, 0xDC, 0xFF, 0xDB,
      0xFF, 0xDF],
    "utf-16be": [0x00, 0x00, 0x00, 0x31, 0x00, 0x32, 0x00, 0x33, 0x00, 0x41, 0x00, 0x42, 0x00, 0x43, 0x00, 0x61, 0x00,
      0x62, 0x00, 0x63, 0x00, 0x80, 0x00, 0xFF, 0x01, 0x00, 0x10, 0x00, 0xFF, 0xFD, 0xD8, 0x00, 0xDC, 0x00, 0xDB, 0xFF,
      0xDF, 0xFF],
  };
  for (const kind of BUFFERS) {
    for (const [encoding, encoded] of Object.entries(octets)) {
      for (let len = 1; len <= 5; len++) {
        s.test(`textdecoder-streaming: ${encoding}, ${len} byte window (${kind})`, () => {
          const decoder = new TextDecoder(encoding);
          let out = "";
          for (let i = 0; i < encoded.length; i += len) {
            out += decoder.decode(onBuffer(kind, encoded.slice(i, i + len)), { stream: true });
          }
          out += decoder.decode();
          assertEquals(out, string);
        });
      }
    }
    s.test(`textdecoder-streaming: UTF-8 chunks (${kind})`, () => {
      const decoder = new TextDecoder();
      const b = (list) => onBuffer(kind, list);
      const steps = [
        [[0xC1], true, "\uFFFD"], [[], false, ""],
        [[0xF5], true, "\uFFFD"], [[], false, ""],
        [[0xE0, 0x41], true, "\uFFFDA"], [[0x42], false, "B"],
        [[0xE0, 0x80], true, "\uFFFD\uFFFD"], [[0x80], false, "\uFFFD"],
        [[0xED, 0xA0], true, "\uFFFD\uFFFD"], [[0x80], false, "\uFFFD"],
        [[0xF0, 0x41], true, "\uFFFDA"], [[0x42], true, "B"], [[0x43], false, "C"],
        [[0xF0, 0x80], true, "\uFFFD\uFFFD"], [[0x80], true, "\uFFFD"], [[0x80], false, "\uFFFD"],
        [[0xF4, 0xA0], true, "\uFFFD\uFFFD"], [[0x80], true, "\uFFFD"], [[0x80], false, "\uFFFD"],
        [[0xF0, 0x90, 0x41], true, "\uFFFDA"], [[0x42], false, "B"],
        // The lead surrogate of a 4-byte sequence comes with the fourth byte, not the third.
        [[0xF0, 0x9F, 0x92], true, ""], [[0xA9], false, "\u{1F4A9}"],
      ];
      steps.forEach(([input, stream, expected], i) => {
        const got = input.length === 0 && !stream ? decoder.decode() : decoder.decode(b(input), { stream });
        assertEquals(got, expected, `step ${i}`);
      });
    });
  }

  // textdecoder-eof
  s.test("textdecoder-eof: end-of-queue", () => {
    const d = (list, label) => new TextDecoder(label).decode(bytes(list));
    assertEquals(d([0xF0]), "\uFFFD");
    assertEquals(d([0xF0, 0x9F]), "\uFFFD");
    assertEquals(d([0xF0, 0x9F, 0x92]), "\uFFFD");
    assertEquals(d([0xF0, 0x9F, 0x41]), "\uFFFDA");
    assertEquals(d([0xF0, 0x41, 0x42]), "\uFFFDAB");
    assertEquals(d([0xF0, 0x41, 0xF0]), "\uFFFDA\uFFFD");
    assertEquals(d([0xF0, 0x8F, 0x92]), "\uFFFD\uFFFD\uFFFD");
    assertEquals(d([0x81, 0x40], "Big5"), "\uFFFD@");
    assertEquals(d([0x81, 0x81], "Big5"), "\uFFFD");
    assertEquals(d([0x87, 0x87, 0x40], "Big5"), "\uFFFD@");
  });
  s.test("textdecoder-eof: end-of-queue with stream: true", () => {
    const decoder = new TextDecoder();
    const big5 = new TextDecoder("Big5");
    const steps = [
      [decoder, [0xF0], true, ""], [decoder, null, false, "\uFFFD"],
      [decoder, [0xF0], true, ""], [decoder, [0x9F], true, ""], [decoder, null, false, "\uFFFD"],
      [decoder, [0xF0, 0x9F], true, ""], [decoder, [0x92], false, "\uFFFD"],
      [decoder, [0xF0, 0x9F], true, ""], [decoder, [0x41], true, "\uFFFDA"], [decoder, null, false, ""],
      [decoder, [0xF0, 0x41, 0x42], true, "\uFFFDAB"], [decoder, null, false, ""],
      [decoder, [0xF0, 0x41, 0xF0], true, "\uFFFDA"], [decoder, null, false, "\uFFFD"],
      [decoder, [0xF0], true, ""], [decoder, [0x8F], true, "\uFFFD\uFFFD"], [decoder, [0x92], true, "\uFFFD"],
      [decoder, null, false, ""],
      [decoder, [0xF0, 0xC2, 0x80, 0x2A], true, "\uFFFD\x80*"], [decoder, null, false, ""],
      [decoder, [0xF0], true, ""], [decoder, [0xC2], true, "\uFFFD"], [decoder, [0x80], true, "\x80"],
      [decoder, [0x2A], true, "*"], [decoder, null, false, ""],
      [decoder, [0xF0], true, ""], [decoder, [0xC2], true, "\uFFFD"], [decoder, [0x80, 0x2A], true, "\x80*"],
      [decoder, null, false, ""],
      [decoder, [0xF0], true, ""], [decoder, [0xC2, 0x80, 0x2A], true, "\uFFFD\x80*"], [decoder, null, false, ""],
      [big5, [0x81, 0x40], true, "\uFFFD@"], [big5, null, false, ""],
      [big5, [0x81], true, ""], [big5, [0x40], true, "\uFFFD@"], [big5, null, false, ""],
    ];
    steps.forEach(([d, input, stream, expected], i) => {
      assertEquals(input === null ? d.decode() : d.decode(bytes(input), { stream }), expected, `step ${i}`);
    });
  });

  // textdecoder-copy
  for (const kind of BUFFERS) {
    s.test(`textdecoder-copy: the buffer changed after decode (${kind})`, () => {
      const view = onBuffer(kind, [0xEF, 0xBB]);
      const view2 = onBuffer(kind, [0xBF, 0x40]);
      const decoder = new TextDecoder("utf-8");
      assertEquals(decoder.decode(view.buffer, { stream: true }), "");
      view[0] = 0x01;
      view[1] = 0x02;
      assertEquals(decoder.decode(view2.buffer), "@");
    });
  }

  // textencoder-constructor-non-utf and api-replacement-encodings: see /labels for every label.
  s.test("textencoder-constructor-non-utf: TextEncoder ignores its argument", () => {
    for (const label of ["utf-16le", "windows-1252", "Shift_JIS", "bogus"]) assertEquals(new TextEncoder(label).encoding, "utf-8");
  });
  s.test("api-replacement-encodings: replacement's labels are refused", () => {
    for (const label of ["csiso2022kr", "hz-gb-2312", "iso-2022-cn", "iso-2022-cn-ext", "iso-2022-kr", "replacement"]) {
      assertThrows(RangeError, () => new TextDecoder(label), label);
    }
  });
  s.test("api-invalid-label: other whitespace does not surround a label", () => {
    for (const label of ["utf-8", "latin1", "utf-16le", "gbk"]) {
      for (const ws of ["\u0000", "\u000b", "\u00a0", "\u2028", "\u2029"]) {
        for (const input of [ws + label, label + ws, ws + label + ws]) {
          assertThrows(RangeError, () => new TextDecoder(input), JSON.stringify(input));
        }
      }
    }
    assertThrows(RangeError, () => new TextDecoder("invalid-invalidLabel"));
  });

  // textencoder-utf16-surrogates
  const surrogates = [
    ["\uD800", "\uFFFD", "lone lead"], ["\uDC00", "\uFFFD", "lone trail"], ["\uD800\u0000", "\uFFFD\u0000", "unmatched lead"],
    ["\uDC00\u0000", "\uFFFD\u0000", "unmatched trail"], ["\uDC00\uD800", "\uFFFD\uFFFD", "swapped pair"],
    ["\uD834\uDD1E", "\uD834\uDD1E", "a pair: U+1D11E"],
  ];
  for (const [input, expected, name] of surrogates) {
    s.test(`textencoder-utf16-surrogates: ${name}`, () => {
      assertEquals(new TextDecoder().decode(new TextEncoder().encode(input)), expected);
    });
  }

  // encodeInto
  const into = [
    ["Hi", 0, 0, []],
    ["A", 1, 10, [0x41]],
    ["\u{1D306}", 2, 4, [0xF0, 0x9D, 0x8C, 0x86]],
    ["\u{1D306}A", 0, 3, []],
    ["\uD834A\uDF06A\u00A5Hi", 5, 10, [0xEF, 0xBF, 0xBD, 0x41, 0xEF, 0xBF, 0xBD, 0x41, 0xC2, 0xA5]],
    ["A\uDF06", 2, 4, [0x41, 0xEF, 0xBF, 0xBD]],
    ["\u00A5\u00A5", 2, 4, [0xC2, 0xA5, 0xC2, 0xA5]],
  ];
  for (const [input, read, size, written] of into) {
    for (const offset of [0, 4]) {
      for (const filler of [0, 0x80]) {
        s.test(`encodeInto: ${JSON.stringify(input)} into ${size} bytes at ${offset}, filler ${filler}`, () => {
          const buffer = new ArrayBuffer(size + offset);
          const all = new Uint8Array(buffer).fill(filler);
          const view = new Uint8Array(buffer, offset, size);
          const result = new TextEncoder().encodeInto(input, view);
          assertEquals(result.read, read, "read");
          assertEquals(result.written, written.length, "written");
          for (let i = 0; i < offset; i++) assertEquals(all[i], filler, `byte ${i} before`);
          for (let i = 0; i < size; i++) assertEquals(view[i], i < written.length ? written[i] : filler, `byte ${i}`);
        });
      }
    }
  }
  for (const View of [DataView, Int8Array, Int16Array, Int32Array, Uint16Array, Uint32Array, Uint8ClampedArray,
    Float32Array, Float64Array]) {
    s.test(`encodeInto: a ${View.name} is not a destination`, () => {
      assertThrows(TypeError, () => new TextEncoder().encodeInto("", new View(new ArrayBuffer(0))));
    });
  }
  if (shared) {
    s.test("encodeInto: a shared destination", () => {
      const view = new Uint8Array(new SharedArrayBuffer(4));
      const result = new TextEncoder().encodeInto("a\u00e9b", view);
      assertEquals(result.read, 3);
      assertEquals(result.written, 4);
      assertArrayEquals(view, [0x61, 0xC3, 0xA9, 0x62]);
    });
  }
  s.test("decode: what is not a buffer is a TypeError", () => {
    for (const input of [null, 1, "text", {}, [65]]) assertThrows(TypeError, () => new TextDecoder().decode(input), show(input));
  });

  // streams/encode-utf8
  const astral = "\u{1F499}", lead = astral[0], trail = astral[1];
  const astralBytes = [0xf0, 0x9f, 0x92, 0x99], replacement = [0xef, 0xbf, 0xbd];
  const input = "I \u{1F499} streams";
  const output = [0x49, 0x20, 0xf0, 0x9f, 0x92, 0x99, 0x20, 0x73, 0x74, 0x72, 0x65, 0x61, 0x6d, 0x73];
  const encodeCases = [
    [[input], [output]],
    [[lead, trail], [astralBytes]],
    [[lead, trail + astral], [[...astralBytes, ...astralBytes]]],
    [[lead, trail + lead, trail], [astralBytes, astralBytes]],
    [[lead, trail + lead + lead, trail], [[...astralBytes, ...replacement], astralBytes]],
    [[lead], [replacement]],
    [[lead, astral], [[...replacement, ...astralBytes]]],
    [[lead, "A"], [[...replacement, 65]]],
    [[lead, lead, trail], [replacement, astralBytes]],
    [[lead, lead], [replacement, replacement]],
    [[lead + lead, trail], [replacement, astralBytes]],
    [[trail, astral], [replacement, astralBytes]],
    [[lead, "", trail], [astralBytes]],
    [[lead, ""], [replacement]],
    [[""], []],
    [["", input], [output]],
    [[input, ""], [output]],
    [["A"], [[65]]],
    [["\xff"], [[195, 191]]],
  ];
  encodeCases.forEach(([chunks, expected], i) => {
    s.test(`streams/encode-utf8: case ${i}`, async () => {
      const got = await readAll(streamOf(chunks).pipeThrough(new TextEncoderStream()));
      assertEquals(got.length, expected.length, "chunks");
      got.forEach((chunk, j) => {
        assertEquals(chunk instanceof Uint8Array, true, `chunk ${j} is a Uint8Array`);
        assertArrayEquals(chunk, expected[j], `chunk ${j}`);
      });
    });
  });
  s.test("streams/encode-bad-chunks: a chunk that is no string errors the stream", async () => {
    const bad = { toString() { throw new RangeError("no"); } };
    const tes = new TextEncoderStream();
    const writer = tes.writable.getWriter();
    const reader = tes.readable.getReader();
    const written = writer.write(bad);
    const read = reader.read();
    await assertRejects(RangeError, written, "write");
    await assertRejects(RangeError, read, "read");
  });
  s.test("streams/encode: attributes", () => {
    const tes = new TextEncoderStream();
    assertEquals(tes.encoding, "utf-8");
    assertEquals(tes.readable instanceof ReadableStream, true);
    assertEquals(tes.writable instanceof WritableStream, true);
  });

  // streams/decode-*
  const decodeCases = [
    ["utf-8", [[0x49, 0x20, 0xf0, 0x9f, 0x92, 0x99, 0x20, 0x73, 0x74, 0x72, 0x65, 0x61, 0x6d, 0x73]], {}, ["I \u{1F499} streams"]],
    ["utf-8", [[0xef], [0xbb], [0xbf, 0x41]], {}, ["A"]],
    ["utf-8", [[0xef, 0xbb, 0xbf, 0x41]], { ignoreBOM: true }, ["\uFEFFA"]],
    ["utf-8", [[0xf0, 0x9f], [0x92, 0x99], [0x21]], {}, ["\u{1F499}", "!"]],
    ["utf-8", [[0x41, 0xf0, 0x9f]], {}, ["A", "\uFFFD"]],
    ["utf-16le", [[0x41], [0x00, 0x3d, 0xd8], [0x99, 0xdc]], {}, ["A", "\u{1F499}"]],
    ["utf-16be", [[0xfe, 0xff, 0x00], [0x41]], {}, ["A"]],
    ["shift_jis", [[0x82], [0xa0, 0x41]], {}, ["\u3042A"]],
  ];
  decodeCases.forEach(([encoding, chunks, options, expected], i) => {
    s.test(`streams/decode: ${encoding} case ${i}`, async () => {
      const got = await readAll(streamOf(chunks.map((c) => new Uint8Array(c))).pipeThrough(new TextDecoderStream(encoding, options)));
      assertEquals(JSON.stringify(got), JSON.stringify(expected));
    });
  });
  s.test("streams/decode-incomplete-input: fatal errors the stream at its end", async () => {
    const output = streamOf([new Uint8Array([0xf0, 0x9f])]).pipeThrough(new TextDecoderStream("utf-8", { fatal: true }));
    await assertRejects(TypeError, output.getReader().read(), "read");
  });
  s.test("streams/decode-incomplete-input: an unfinished sequence is U+FFFD at the end", async () => {
    const output = streamOf([new Uint8Array([0xf0, 0x9f])]).pipeThrough(new TextDecoderStream());
    assertEquals(JSON.stringify(await readAll(output)), JSON.stringify(["\uFFFD"]));
  });
  for (const [name, value] of [["undefined", undefined], ["null", null], ["numeric", 3.14], ["object", {}], ["array", [65]]]) {
    s.test(`streams/decode-bad-chunks: a chunk of type ${name} errors the stream`, async () => {
      const tds = new TextDecoderStream();
      const reader = tds.readable.getReader();
      const writer = tds.writable.getWriter();
      const written = writer.write(value);
      const read = reader.read();
      await assertRejects(TypeError, written, "write");
      await assertRejects(TypeError, read, "read");
    });
  }
  s.test("streams/decode: attributes", () => {
    const tds = new TextDecoderStream("latin1", { fatal: true, ignoreBOM: true });
    assertEquals(tds.encoding, "windows-1252");
    assertEquals(tds.fatal, true);
    assertEquals(tds.ignoreBOM, true);
    assertThrows(RangeError, () => new TextDecoderStream("bogus"));
  });
  return s.run();
}

// Every label of the standard's table names its encoding, whatever its case and ASCII whitespace around it.
function labels(table) {
  const failures = [];
  let total = 0;
  for (const { name, labels } of table) {
    for (const label of labels) {
      total++;
      const errors = [];
      const expected = name.toLowerCase();
      for (const variant of [label, label.toUpperCase(), ...[" ", "\t", "\n", "\f", "\r"].flatMap((ws) => [ws + label, label + ws, ws + label + ws])]) {
        try {
          const got = new TextDecoder(variant).encoding;
          if (name === "replacement") errors.push(`${JSON.stringify(variant)} gave ${got}, not a RangeError`);
          else if (got !== expected) errors.push(`${JSON.stringify(variant)} gave ${got}`);
        } catch (e) {
          if (name !== "replacement" || !(e instanceof RangeError)) errors.push(`${JSON.stringify(variant)} threw ${e}`);
        }
      }
      if (name !== "replacement" && new TextDecoder(name).encoding !== expected) errors.push(`the name ${name} gave ${new TextDecoder(name).encoding}`);
      if (errors.length) failures.push({ name: `${label} => ${name}`, error: errors.join("; ") });
    }
  }
  return { total, failures };
}

// What decoding gives on fixed inputs, for Deno to give the same.
function observe() {
  const out = {};
  const all = new Uint8Array(256).map((_, i) => i);
  for (const encoding of ["IBM866", "ISO-8859-2", "ISO-8859-5", "ISO-8859-7", "ISO-8859-8", "KOI8-R", "KOI8-U",
    "macintosh", "windows-874", "windows-1250", "windows-1251", "windows-1252", "windows-1253", "windows-1255",
    "windows-1257", "x-mac-cyrillic", "x-user-defined"]) {
    out[encoding] = new TextDecoder(encoding).decode(all);
  }
  const samples = {
    "shift_jis": [0x82, 0xa0, 0x93, 0xfa, 0x96, 0x7b, 0x8c, 0xea, 0x41, 0x81],
    "euc-jp": [0xa4, 0xa2, 0xc6, 0xfc, 0xcb, 0xdc, 0x8e, 0xb1, 0xa4],
    "iso-2022-jp": [0x1b, 0x24, 0x42, 0x24, 0x22, 0x46, 0x7c, 0x1b, 0x28, 0x42, 0x41, 0x1b, 0x24],
    "gbk": [0xc4, 0xe3, 0xba, 0xc3, 0x80, 0x41, 0xff],
    "gb18030": [0xc4, 0xe3, 0x81, 0x30, 0x81, 0x30, 0x95, 0x32, 0x82, 0x36, 0x84],
    "big5": [0xa4, 0xa4, 0xa4, 0xe5, 0x88, 0x62, 0x88, 0x64, 0x80],
    "euc-kr": [0xc7, 0xd1, 0xb1, 0xb9, 0xbe, 0xee, 0x81, 0x41, 0xc8],
    "utf-16be": [0xd8, 0x3d, 0xdc, 0xa9, 0xdc, 0x00, 0x00],
    "utf-16le": [0x3d, 0xd8, 0xa9, 0xdc, 0x00, 0xdc, 0x41],
  };
  for (const [encoding, list] of Object.entries(samples)) {
    const input = new Uint8Array(list);
    const streamed = new TextDecoder(encoding);
    let text = "";
    for (const b of input) text += streamed.decode(new Uint8Array([b]), { stream: true });
    text += streamed.decode();
    let fatal;
    try {
      fatal = new TextDecoder(encoding, { fatal: true }).decode(input);
    } catch (e) {
      fatal = e.name;
    }
    out[encoding] = [new TextDecoder(encoding).decode(input), text, fatal];
  }
  out.encode = [...new TextEncoder().encode("a\u00e9\u20ac\u{1F600}\uD800z")];
  out.attributes = [new TextDecoder("latin1").encoding, new TextDecoder("utf-16").encoding, new TextDecoder("ucs-2").encoding,
    new TextDecoder("sjis").encoding, new TextDecoder(" UTF8 ").encoding, Object.prototype.toString.call(new TextDecoder()),
    Object.prototype.toString.call(new TextEncoder()), Object.keys(TextDecoder.prototype).sort()];
  out.errors = [
    [() => new TextDecoder("bogus"), () => new TextDecoder("utf-8", 5), () => new TextDecoder().decode("x"),
      () => new TextEncoder().encodeInto("x"), () => new TextEncoder().encodeInto("x", [0]), () => TextDecoder()],
  ].flat().map((f) => { try { f(); return "ok"; } catch (e) { return e.constructor.name; } });
  return out;
}

export default {
  async fetch(request) {
    const path = new URL(request.url).pathname.replace(/^.*\//, "/"); // (the last segment: Portico routes on a prefix)
    if (path === "/wpt") return Response.json(await wpt());
    if (path === "/labels") return Response.json(labels(await request.json()));
    if (path === "/observe") return Response.json(observe());
    if (path === "/pipe") {
      // The request body's text, upper-cased, as it comes: bytes to text, text to bytes, a chunk at a time.
      const upper = new TransformStream({ transform(chunk, controller) { controller.enqueue(chunk.toUpperCase()); } });
      const label = new URL(request.url).searchParams.get("encoding") ?? "utf-8";
      return new Response(request.body.pipeThrough(new TextDecoderStream(label)).pipeThrough(upper).pipeThrough(new TextEncoderStream()));
    }
    return new Response("not found\n", { status: 404 });
  },
};
