// TextEncoder, TextDecoder, TextEncoderStream and TextDecoderStream, as the WHATWG Encoding Standard defines
// them. Decoding is encoding_rs's (encoding.rs): every encoding of the standard and its labels, the BOM, the
// fatal mode, and streams whose sequences are split between calls. A module evaluated the first time a handler
// touches one of these names (lazy.js), whose default export webapi.rs calls with the natives, which stay out of
// the handler's reach.
export default (native) => {
  const { encodingFor, decode, decoder, decodeMore, encode, encodeInto } = native;
  const define = (name, value) =>
    Object.defineProperty(globalThis, name, { value, writable: true, configurable: true, enumerable: false });
  const isObject = (value) => value !== null && (typeof value === "object" || typeof value === "function");
  // As WebIDL lays out an interface: members enumerable, a @@toStringTag.
  const webidl = (Class, name) => {
    const prototype = Class.prototype;
    for (const key of Object.getOwnPropertyNames(prototype)) {
      if (key !== "constructor") Object.defineProperty(prototype, key, { enumerable: true });
    }
    Object.defineProperty(prototype, Symbol.toStringTag, { value: name, configurable: true });
    define(name, Class);
  };
  const required = (given, count, what) => {
    if (given < count) throw new TypeError(`${what}: ${count} argument${count > 1 ? "s" : ""} required, but only ${given} present`);
  };
  // A WebIDL dictionary: undefined and null are the defaults, anything else not an object is a TypeError.
  const dictionary = (value, what) => {
    if (value === undefined || value === null) return {};
    if (!isObject(value)) throw new TypeError(`${what}: the options are not an object`);
    return value;
  };
  // WebIDL's USVString: a symbol is a TypeError, lone surrogates become U+FFFD.
  const usv = (value) => `${value}`.toWellFormed();
  const EMPTY = new Uint8Array(0);
  const isShared = (buffer) => typeof SharedArrayBuffer === "function" && buffer instanceof SharedArrayBuffer;
  // An AllowSharedBufferSource's bytes as a Uint8Array (a detached buffer has none; a shared one is copied, as
  // the standard copies every input).
  const bytesOf = (input, what) => {
    let buffer, offset = 0, length;
    if (input instanceof ArrayBuffer || isShared(input)) {
      buffer = input;
    } else if (ArrayBuffer.isView(input)) {
      buffer = input.buffer;
      offset = input.byteOffset;
      length = input.byteLength;
    } else {
      throw new TypeError(`${what}: the input is not an ArrayBuffer, a typed array or a DataView`);
    }
    if (buffer.detached === true) return EMPTY;
    const view = new Uint8Array(buffer, offset, length);
    return isShared(buffer) ? view.slice() : view;
  };

  class TextEncoder {
    get encoding() { return "utf-8"; }
    encode(input = "") { return new Uint8Array(encode(usv(input))); }
    encodeInto(source, destination) {
      required(arguments.length, 2, "Failed to execute 'encodeInto' on 'TextEncoder'");
      const text = usv(source);
      if (!(destination instanceof Uint8Array)) {
        throw new TypeError("Failed to execute 'encodeInto' on 'TextEncoder': the destination is not a Uint8Array");
      }
      let read, written;
      if (isShared(destination.buffer)) {
        // (The natives write ArrayBuffers: a shared destination takes a copy.)
        const out = new Uint8Array(destination.length);
        [read, written] = encodeInto(text, out);
        destination.set(out.subarray(0, written));
      } else {
        [read, written] = encodeInto(text, destination);
      }
      return { read, written };
    }
  }
  webidl(TextEncoder, "TextEncoder");

  class TextDecoder {
    #encoding;
    #fatal;
    #ignoreBOM;
    #stream = null; // the decoder of a stream under way (`decode(bytes, { stream: true })`)
    constructor(label = "utf-8", options = undefined) {
      label = `${label}`;
      const init = dictionary(options, "Failed to construct 'TextDecoder'");
      this.#fatal = Boolean(init.fatal);
      this.#ignoreBOM = Boolean(init.ignoreBOM);
      const encoding = encodingFor(label.toWellFormed());
      if (encoding === undefined) {
        throw new RangeError(`Failed to construct 'TextDecoder': the encoding label provided ('${label}') is invalid`);
      }
      this.#encoding = encoding;
    }
    get encoding() { return this.#encoding; }
    get fatal() { return this.#fatal; }
    get ignoreBOM() { return this.#ignoreBOM; }
    decode(input = undefined, options = undefined) {
      const what = "Failed to execute 'decode' on 'TextDecoder'";
      const bytes = input === undefined ? EMPTY : bytesOf(input, what);
      const stream = Boolean(dictionary(options, what).stream);
      let text;
      if (this.#stream === null && !stream) {
        text = decode(this.#encoding, bytes, this.#fatal, this.#ignoreBOM);
      } else {
        const current = this.#stream ?? decoder(this.#encoding, this.#ignoreBOM);
        // A call that does not stream ends the stream, whatever it gives: the next one starts a new one.
        this.#stream = stream ? current : null;
        text = decodeMore(current, bytes, !stream, this.#fatal);
      }
      if (text === undefined) throw new TypeError(`${what}: the encoded data is not valid ${this.#encoding}`);
      return text;
    }
  }
  webidl(TextDecoder, "TextDecoder");

  // The streams: a TransformStream (web-streams-polyfill, loaded when the first one is made) around the above.
  class TextEncoderStream {
    #transform;
    constructor() {
      let lead = ""; // a lead surrogate that ended the last chunk, waiting for its trail
      this.#transform = new globalThis.TransformStream({
        transform(chunk, controller) {
          let text = lead + `${chunk}`;
          lead = "";
          const last = text.charCodeAt(text.length - 1);
          if (last >= 0xd800 && last <= 0xdbff) {
            lead = text.slice(-1);
            text = text.slice(0, -1);
          }
          if (text !== "") controller.enqueue(new Uint8Array(encode(text.toWellFormed())));
        },
        flush(controller) {
          if (lead !== "") controller.enqueue(new Uint8Array([0xef, 0xbf, 0xbd]));
        },
      });
    }
    get encoding() { return "utf-8"; }
    get readable() { return this.#transform.readable; }
    get writable() { return this.#transform.writable; }
  }
  webidl(TextEncoderStream, "TextEncoderStream");

  class TextDecoderStream {
    #decoder;
    #transform;
    constructor(label = "utf-8", options = undefined) {
      const textDecoder = new TextDecoder(label, options);
      this.#decoder = textDecoder;
      this.#transform = new globalThis.TransformStream({
        transform(chunk, controller) {
          // (A chunk is a buffer: decode()'s `undefined` for no bytes is no chunk.)
          if (chunk === undefined) throw new TypeError("TextDecoderStream: a chunk is an ArrayBuffer, a typed array or a DataView");
          const text = textDecoder.decode(chunk, { stream: true });
          if (text !== "") controller.enqueue(text);
        },
        flush(controller) {
          const text = textDecoder.decode();
          if (text !== "") controller.enqueue(text);
        },
      });
    }
    get encoding() { return this.#decoder.encoding; }
    get fatal() { return this.#decoder.fatal; }
    get ignoreBOM() { return this.#decoder.ignoreBOM; }
    get readable() { return this.#transform.readable; }
    get writable() { return this.#transform.writable; }
  }
  webidl(TextDecoderStream, "TextDecoderStream");
};
