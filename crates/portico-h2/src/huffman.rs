//! HPACK's Huffman code (RFC 7541 Appendix B), decoded by a table-driven state machine four bits at a time
//! (as nghttp2 and `h2` do) rather than bit by bit: one lookup per nibble, at most one symbol out per lookup
//! (the shortest code is 5 bits). The table is built at compile time from the RFC's 257 (code, length) pairs,
//! so there is nothing to initialise at run time and no branch on "is it built yet" on the hot path.
//!
//! Portico's encoder never Huffman-codes (it writes raw literals: cheaper in CPU, and responses are mostly
//! values the peer cannot compress much); `encode` exists for the tests.

/// Why a Huffman-coded string is invalid (RFC 7541 5.2); HPACK turns it into its own error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HuffmanError {
    /// The string contains the EOS symbol.
    Eos,
    /// More than 7 bits of padding.
    PaddingTooLong,
    /// Padding that is not the most significant bits of EOS (all ones).
    PaddingNotOnes,
}

/// RFC 7541 Appendix B: (code, length in bits) for symbols 0..=255 and EOS (256), codes right-aligned.
/// The tests check the table is a complete canonical code, which pins every code down by its length.
#[rustfmt::skip]
const CODES: [(u32, u8); 257] = [
    (0x1ff8, 13), (0x7fffd8, 23), (0xfffffe2, 28), (0xfffffe3, 28), // 0 1 2 3
    (0xfffffe4, 28), (0xfffffe5, 28), (0xfffffe6, 28), (0xfffffe7, 28), // 4 5 6 7
    (0xfffffe8, 28), (0xffffea, 24), (0x3ffffffc, 30), (0xfffffe9, 28), // 8 9 10 11
    (0xfffffea, 28), (0x3ffffffd, 30), (0xfffffeb, 28), (0xfffffec, 28), // 12 13 14 15
    (0xfffffed, 28), (0xfffffee, 28), (0xfffffef, 28), (0xffffff0, 28), // 16 17 18 19
    (0xffffff1, 28), (0xffffff2, 28), (0x3ffffffe, 30), (0xffffff3, 28), // 20 21 22 23
    (0xffffff4, 28), (0xffffff5, 28), (0xffffff6, 28), (0xffffff7, 28), // 24 25 26 27
    (0xffffff8, 28), (0xffffff9, 28), (0xffffffa, 28), (0xffffffb, 28), // 28 29 30 31
    (0x14, 6), (0x3f8, 10), (0x3f9, 10), (0xffa, 12), // ' ' ! " #
    (0x1ff9, 13), (0x15, 6), (0xf8, 8), (0x7fa, 11), // $ % & '
    (0x3fa, 10), (0x3fb, 10), (0xf9, 8), (0x7fb, 11), // ( ) * +
    (0xfa, 8), (0x16, 6), (0x17, 6), (0x18, 6), // , - . /
    (0x0, 5), (0x1, 5), (0x2, 5), (0x19, 6), // 0 1 2 3
    (0x1a, 6), (0x1b, 6), (0x1c, 6), (0x1d, 6), // 4 5 6 7
    (0x1e, 6), (0x1f, 6), (0x5c, 7), (0xfb, 8), // 8 9 : ;
    (0x7ffc, 15), (0x20, 6), (0xffb, 12), (0x3fc, 10), // < = > ?
    (0x1ffa, 13), (0x21, 6), (0x5d, 7), (0x5e, 7), // @ A B C
    (0x5f, 7), (0x60, 7), (0x61, 7), (0x62, 7), // D E F G
    (0x63, 7), (0x64, 7), (0x65, 7), (0x66, 7), // H I J K
    (0x67, 7), (0x68, 7), (0x69, 7), (0x6a, 7), // L M N O
    (0x6b, 7), (0x6c, 7), (0x6d, 7), (0x6e, 7), // P Q R S
    (0x6f, 7), (0x70, 7), (0x71, 7), (0x72, 7), // T U V W
    (0xfc, 8), (0x73, 7), (0xfd, 8), (0x1ffb, 13), // X Y Z [
    (0x7fff0, 19), (0x1ffc, 13), (0x3ffc, 14), (0x22, 6), // \ ] ^ _
    (0x7ffd, 15), (0x3, 5), (0x23, 6), (0x4, 5), // ` a b c
    (0x24, 6), (0x5, 5), (0x25, 6), (0x26, 6), // d e f g
    (0x27, 6), (0x6, 5), (0x74, 7), (0x75, 7), // h i j k
    (0x28, 6), (0x29, 6), (0x2a, 6), (0x7, 5), // l m n o
    (0x2b, 6), (0x76, 7), (0x2c, 6), (0x8, 5), // p q r s
    (0x9, 5), (0x2d, 6), (0x77, 7), (0x78, 7), // t u v w
    (0x79, 7), (0x7a, 7), (0x7b, 7), (0x7ffe, 15), // x y z {
    (0x7fc, 11), (0x3ffd, 14), (0x1ffd, 13), (0xffffffc, 28), // | } ~ 127
    (0xfffe6, 20), (0x3fffd2, 22), (0xfffe7, 20), (0xfffe8, 20), // 128 129 130 131
    (0x3fffd3, 22), (0x3fffd4, 22), (0x3fffd5, 22), (0x7fffd9, 23), // 132 133 134 135
    (0x3fffd6, 22), (0x7fffda, 23), (0x7fffdb, 23), (0x7fffdc, 23), // 136 137 138 139
    (0x7fffdd, 23), (0x7fffde, 23), (0xffffeb, 24), (0x7fffdf, 23), // 140 141 142 143
    (0xffffec, 24), (0xffffed, 24), (0x3fffd7, 22), (0x7fffe0, 23), // 144 145 146 147
    (0xffffee, 24), (0x7fffe1, 23), (0x7fffe2, 23), (0x7fffe3, 23), // 148 149 150 151
    (0x7fffe4, 23), (0x1fffdc, 21), (0x3fffd8, 22), (0x7fffe5, 23), // 152 153 154 155
    (0x3fffd9, 22), (0x7fffe6, 23), (0x7fffe7, 23), (0xffffef, 24), // 156 157 158 159
    (0x3fffda, 22), (0x1fffdd, 21), (0xfffe9, 20), (0x3fffdb, 22), // 160 161 162 163
    (0x3fffdc, 22), (0x7fffe8, 23), (0x7fffe9, 23), (0x1fffde, 21), // 164 165 166 167
    (0x7fffea, 23), (0x3fffdd, 22), (0x3fffde, 22), (0xfffff0, 24), // 168 169 170 171
    (0x1fffdf, 21), (0x3fffdf, 22), (0x7fffeb, 23), (0x7fffec, 23), // 172 173 174 175
    (0x1fffe0, 21), (0x1fffe1, 21), (0x3fffe0, 22), (0x1fffe2, 21), // 176 177 178 179
    (0x7fffed, 23), (0x3fffe1, 22), (0x7fffee, 23), (0x7fffef, 23), // 180 181 182 183
    (0xfffea, 20), (0x3fffe2, 22), (0x3fffe3, 22), (0x3fffe4, 22), // 184 185 186 187
    (0x7ffff0, 23), (0x3fffe5, 22), (0x3fffe6, 22), (0x7ffff1, 23), // 188 189 190 191
    (0x3ffffe0, 26), (0x3ffffe1, 26), (0xfffeb, 20), (0x7fff1, 19), // 192 193 194 195
    (0x3fffe7, 22), (0x7ffff2, 23), (0x3fffe8, 22), (0x1ffffec, 25), // 196 197 198 199
    (0x3ffffe2, 26), (0x3ffffe3, 26), (0x3ffffe4, 26), (0x7ffffde, 27), // 200 201 202 203
    (0x7ffffdf, 27), (0x3ffffe5, 26), (0xfffff1, 24), (0x1ffffed, 25), // 204 205 206 207
    (0x7fff2, 19), (0x1fffe3, 21), (0x3ffffe6, 26), (0x7ffffe0, 27), // 208 209 210 211
    (0x7ffffe1, 27), (0x3ffffe7, 26), (0x7ffffe2, 27), (0xfffff2, 24), // 212 213 214 215
    (0x1fffe4, 21), (0x1fffe5, 21), (0x3ffffe8, 26), (0x3ffffe9, 26), // 216 217 218 219
    (0xffffffd, 28), (0x7ffffe3, 27), (0x7ffffe4, 27), (0x7ffffe5, 27), // 220 221 222 223
    (0xfffec, 20), (0xfffff3, 24), (0xfffed, 20), (0x1fffe6, 21), // 224 225 226 227
    (0x3fffe9, 22), (0x1fffe7, 21), (0x1fffe8, 21), (0x7ffff3, 23), // 228 229 230 231
    (0x3fffea, 22), (0x3fffeb, 22), (0x1ffffee, 25), (0x1ffffef, 25), // 232 233 234 235
    (0xfffff4, 24), (0xfffff5, 24), (0x3ffffea, 26), (0x7ffff4, 23), // 236 237 238 239
    (0x3ffffeb, 26), (0x7ffffe6, 27), (0x3ffffec, 26), (0x3ffffed, 26), // 240 241 242 243
    (0x7ffffe7, 27), (0x7ffffe8, 27), (0x7ffffe9, 27), (0x7ffffea, 27), // 244 245 246 247
    (0x7ffffeb, 27), (0xffffffe, 28), (0x7ffffec, 27), (0x7ffffed, 27), // 248 249 250 251
    (0x7ffffee, 27), (0x7ffffef, 27), (0x7fffff0, 27), (0x3ffffee, 26), // 252 253 254 255
    (0x3fffffff, 30), // EOS
];

/// A transition out of a state for one nibble.
#[derive(Clone, Copy)]
struct Step {
    /// The state after the nibble: an internal node of the code tree (0 is the root, at a symbol boundary).
    next: u8,
    /// The symbol completed by this nibble, if `flags` has `EMIT`.
    sym: u8,
    flags: u8,
}

/// The nibble completed a symbol: `sym` is output.
const EMIT: u8 = 1;
/// The nibble completed EOS, which must not appear in a string (RFC 7541 5.2).
const FAIL: u8 = 2;
/// The bits since the last symbol are a valid padding: at most 7 bits, all ones (a prefix of EOS).
const ACCEPT: u8 = 4;
/// The bits since the last symbol are all ones (whatever their number): tells the two padding errors apart.
const ONES: u8 = 8;

/// A leaf in `tree`: the symbol in the low bits.
const LEAF: u16 = 0x8000;

/// The state machine: 256 states (the internal nodes of the tree of 257 leaves) x 16 nibbles.
static TABLE: [[Step; 16]; 256] = build();

/// Builds the code tree from `CODES`, then walks four bits from every internal node.
const fn build() -> [[Step; 16]; 256] {
    // tree[node] = [child for bit 0, child for bit 1]: an internal node's number, or LEAF | symbol.
    // 0 means "not set yet" (the root, node 0, is nobody's child).
    let mut tree = [[0u16; 2]; 256];
    // Per node: its depth and whether the path to it is all ones, for the padding rules.
    let mut depth = [0u8; 256];
    let mut ones = [false; 256];
    ones[0] = true;
    let mut nodes = 1;
    let mut sym = 0;
    while sym < 257 {
        let (code, len) = CODES[sym];
        let mut node = 0;
        let mut bit = len;
        while bit > 1 {
            bit -= 1;
            let b = ((code >> bit) & 1) as usize;
            if tree[node][b] == 0 {
                tree[node][b] = nodes as u16;
                depth[nodes] = depth[node] + 1;
                ones[nodes] = ones[node] && b == 1;
                nodes += 1;
            }
            node = tree[node][b] as usize;
        }
        tree[node][(code & 1) as usize] = LEAF | sym as u16;
        sym += 1;
    }
    assert!(nodes == 256, "a complete code of 257 symbols has 256 internal nodes");

    let mut table = [[Step { next: 0, sym: 0, flags: 0 }; 16]; 256];
    let mut state = 0;
    while state < 256 {
        let mut nibble = 0;
        while nibble < 16 {
            let mut node = state;
            let mut step = Step { next: 0, sym: 0, flags: 0 };
            let mut bit = 4;
            while bit > 0 {
                bit -= 1;
                let child = tree[node][(nibble >> bit) & 1];
                if child & LEAF != 0 {
                    let s = child & !LEAF;
                    if s == 256 {
                        step.flags = FAIL;
                        break;
                    }
                    step.sym = s as u8;
                    step.flags = EMIT;
                    node = 0;
                } else {
                    node = child as usize;
                }
            }
            if step.flags & FAIL == 0 {
                step.next = node as u8;
                if ones[node] {
                    step.flags |= ONES;
                    if depth[node] <= 7 {
                        step.flags |= ACCEPT;
                    }
                }
            }
            table[state][nibble] = step;
            nibble += 1;
        }
        state += 1;
    }
    table
}

/// Appends the decoding of the Huffman-coded string `src` to `dst`.
pub(crate) fn decode(src: &[u8], dst: &mut Vec<u8>) -> Result<(), HuffmanError> {
    // Each symbol takes at least 5 bits: one reservation, no growth inside the loop.
    dst.reserve(src.len() * 8 / 5);
    let mut state = 0u8;
    // An empty string is valid: the root accepts.
    let mut flags = ACCEPT;
    for &byte in src {
        for nibble in [byte >> 4, byte & 0x0f] {
            let step = TABLE[state as usize][nibble as usize];
            if step.flags & FAIL != 0 {
                return Err(HuffmanError::Eos);
            }
            if step.flags & EMIT != 0 {
                dst.push(step.sym);
            }
            state = step.next;
            flags = step.flags;
        }
    }
    if flags & ACCEPT != 0 {
        Ok(())
    } else if flags & ONES != 0 {
        Err(HuffmanError::PaddingTooLong)
    } else {
        Err(HuffmanError::PaddingNotOnes)
    }
}

/// Appends the Huffman coding of `src` to `dst`, padded with ones (the tests' reference encoder).
#[cfg(test)]
pub(crate) fn encode(src: &[u8], dst: &mut Vec<u8>) {
    let mut acc: u64 = 0;
    let mut bits = 0u32;
    for &b in src {
        let (code, len) = CODES[b as usize];
        acc = (acc << len) | u64::from(code);
        bits += u32::from(len);
        while bits >= 8 {
            bits -= 8;
            dst.push((acc >> bits) as u8);
        }
    }
    if bits > 0 {
        dst.push(((acc << (8 - bits)) as u8) | (0xff >> bits));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    fn dec(src: &[u8]) -> Result<Vec<u8>, HuffmanError> {
        let mut out = Vec::new();
        decode(src, &mut out).map(|()| out)
    }

    #[test]
    fn table_is_a_complete_canonical_code() {
        // Canonical: sorted by (length, symbol), each code is the previous one plus one, shifted to its length.
        let mut order: Vec<usize> = (0..257).collect();
        order.sort_by_key(|&s| (CODES[s].1, s));
        let mut expect = 0u32;
        let mut prev_len = CODES[order[0]].1;
        for (i, &s) in order.iter().enumerate() {
            let (code, len) = CODES[s];
            if i > 0 {
                expect = (expect + 1) << (len - prev_len);
            }
            prev_len = len;
            assert_eq!(code, expect, "symbol {s}");
            assert!(u64::from(code) < 1 << len, "symbol {s} fits its length");
        }
        // Complete: the last code is all ones (EOS, 30 bits), so Kraft's sum is exactly one.
        assert_eq!(CODES[256], (0x3fff_ffff, 30));
        assert_eq!(CODES[order[256]], CODES[256]);
        // A few codes as printed in the RFC.
        assert_eq!(CODES[b'0' as usize], (0x0, 5));
        assert_eq!(CODES[b' ' as usize], (0x14, 6));
        assert_eq!(CODES[b'a' as usize], (0x3, 5));
        assert_eq!(CODES[b'~' as usize], (0x1ffd, 13));
        assert_eq!(CODES[0], (0x1ff8, 13));
        assert_eq!(CODES[255], (0x3ffffee, 26));
    }

    /// The Huffman-coded strings of RFC 7541 C.4 and C.6.
    const RFC_STRINGS: [(&str, &str); 13] = [
        ("f1e3 c2e5 f23a 6ba0 ab90 f4ff", "www.example.com"),
        ("a8eb 1064 9cbf", "no-cache"),
        ("25a8 49e9 5ba9 7d7f", "custom-key"),
        ("25a8 49e9 5bb8 e8b4 bf", "custom-value"),
        ("6402", "302"),
        ("aec3 771a 4b", "private"),
        ("d07a be94 1054 d444 a820 0595 040b 8166 e082 a62d 1bff", "Mon, 21 Oct 2013 20:13:21 GMT"),
        ("9d29 ad17 1863 c78f 0b97 c8e9 ae82 ae43 d3", "https://www.example.com"),
        ("640e ff", "307"),
        ("d07a be94 1054 d444 a820 0595 040b 8166 e084 a62d 1bff", "Mon, 21 Oct 2013 20:13:22 GMT"),
        ("9bd9 ab", "gzip"),
        (
            "94e7 821d d7f2 e6c7 b335 dfdf cd5b 3960 d5af 2708 7f36 72c1 ab27 0fb5 291f 9587 3160 65c0 03ed 4ee5 b106 3d50 07",
            "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1",
        ),
        ("", ""),
    ];

    #[test]
    fn rfc_examples_decode_and_encode() {
        for (coded, text) in RFC_STRINGS {
            assert_eq!(dec(&hex(coded)).unwrap(), text.as_bytes(), "{text}");
            let mut out = Vec::new();
            encode(text.as_bytes(), &mut out);
            assert_eq!(out, hex(coded), "{text}");
        }
    }

    #[test]
    fn every_byte_round_trips() {
        let all: Vec<u8> = (0..=255).collect();
        for len in 0..all.len() {
            // Rotations, so that every symbol is seen at every padding length.
            let src: Vec<u8> = all.iter().cycle().skip(len).take(len).copied().collect();
            let mut coded = Vec::new();
            encode(&src, &mut coded);
            assert_eq!(dec(&coded).unwrap(), src);
        }
    }

    #[test]
    fn eos_in_a_string_is_an_error() {
        // EOS alone (30 ones) padded with two ones, and after a symbol.
        assert_eq!(dec(&[0xff, 0xff, 0xff, 0xff]), Err(HuffmanError::Eos));
        // '0' (00000) then EOS: 00000111 11111111 11111111 11111111 111(padding: 1111 1)
        assert_eq!(dec(&[0x07, 0xff, 0xff, 0xff, 0xff]), Err(HuffmanError::Eos));
    }

    #[test]
    fn padding_longer_than_seven_bits_is_an_error() {
        // 'a' (00011) then 11 ones of padding.
        assert_eq!(dec(&[0x1f, 0xff]), Err(HuffmanError::PaddingTooLong));
        assert_eq!(dec(&[0x1f]).unwrap(), b"a");
        // A whole byte of ones is 8 bits of padding even with no symbol.
        assert_eq!(dec(&[0xff]), Err(HuffmanError::PaddingTooLong));
        // Seven is fine: '0' (00000) then 111, or '0' then '0' (10 bits) then 111111.
        assert_eq!(dec(&[0x07]).unwrap(), b"0");
        assert_eq!(dec(&[0x00, 0x3f]).unwrap(), b"00");
        assert_eq!(dec(&[0x07, 0xff]), Err(HuffmanError::PaddingTooLong));
    }

    #[test]
    fn padding_with_a_zero_is_an_error() {
        // 'a' (00011) then 110: not a prefix of EOS.
        assert_eq!(dec(&[0x1e]), Err(HuffmanError::PaddingNotOnes));
        // 'a' then 000: the start of '0', cut short.
        assert_eq!(dec(&[0x18]), Err(HuffmanError::PaddingNotOnes));
    }
}
