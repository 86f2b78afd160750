// The Web APIs a handler may not need (events.js, clone.js, encoding.js, crypto.js), evaluated the first time a
// handler touches one of their names: a runtime that never does keeps the memory they would take (about 200 KiB
// each runtime for events.js).
(() => {
  "use strict";
  const lazy = (names, load) => {
    let loaded = false;
    for (const name of names) {
      Object.defineProperty(globalThis, name, {
        configurable: true,
        enumerable: false,
        get() {
          if (!loaded) {
            loaded = true;
            for (const other of names) delete globalThis[other];
            load();
          }
          return globalThis[name];
        },
        set(value) {
          Object.defineProperty(globalThis, name, { value, writable: true, configurable: true, enumerable: false });
        },
      });
    }
  };
  lazy(["DOMException", "Event", "CustomEvent", "EventTarget", "AbortController", "AbortSignal"], __portico_load_events);
  lazy(["structuredClone"], __portico_load_clone);
  lazy(["TextEncoder", "TextDecoder", "TextEncoderStream", "TextDecoderStream"], __portico_load_encoding);
  lazy(["crypto", "Crypto", "SubtleCrypto", "CryptoKey"], __portico_load_crypto);
})();
