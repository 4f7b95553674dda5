//! The JSON reading shared by the allocation-free scanners of the request path
//! (`answer_scan`, `request_scan`): a [`Cursor`] over a body that reads JSON the way
//! serde_json does, so that each scanner gives serde_json's verdict, or leaves a corner
//! to serde_json ([`Stop::Unsure`]).
//!
//! A value the caller does not keep is read in one of two ways, as serde_json reads it:
//! - *skipped*, as serde_json's `IgnoredAny` (its `ignore_value`): the grammar is
//!   checked, escapes must be well formed and control characters are refused, but
//!   neither UTF-8 nor `\u` surrogate pairing is checked, numbers are not computed, and
//!   there is no nesting limit ([`Cursor::skip_value`], up to [`MAX_SKIPPED_DEPTH`]);
//! - *checked as a `serde_json::Value`* (serde_json builds it, then it is dropped):
//!   strings and object keys must be valid UTF-8 with `\u` surrogates paired, numbers
//!   are computed (a float that overflows is an error), and nesting counts against
//!   serde_json's recursion limit ([`Cursor::value_as_u64`], up to the depth given).
//!
//! Strings are scanned a word of eight bytes at a time, as serde_json's `skip_to_escape`
//! does.

/// Why a scan stopped before the end of the body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    /// serde_json meets a syntax or end-of-input error first.
    Syntax,
    /// serde_json meets a data error first (a known member twice, of the wrong type or
    /// out of range), or the caller refuses what it read.
    Data,
    /// A corner this reader leaves to serde_json.
    Unsure,
}

/// Deepest nesting of a skipped value this reader follows (serde_json has no limit
/// there); deeper is [`Stop::Unsure`].
pub(crate) const MAX_SKIPPED_DEPTH: usize = 512;

/// Deepest nesting of a value checked as a `serde_json::Value` that this reader
/// follows; deeper is [`Stop::Unsure`]. serde_json refuses a `Value` nested 127 deep
/// inside a top-level object (its recursion limit of 128, the object counted): this
/// stays well below, so that the margin covers one more level not counted here (an
/// empty array or object is not pushed).
pub(crate) const MAX_VALUE_DEPTH: usize = 100;

/// A position in the body.
pub(crate) struct Cursor<'a> {
    /// The whole body.
    pub(crate) bytes: &'a [u8],
    /// The index of the next byte to read.
    pub(crate) at: usize,
}

impl<'a> Cursor<'a> {
    /// The byte at the cursor.
    pub(crate) fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    /// Skips JSON whitespace; returns the byte after it.
    pub(crate) fn skip_ws(&mut self) -> Option<u8> {
        let byte = self.peek()?;
        if byte > b' ' {
            // Nothing to skip: the common case of compact JSON.
            return Some(byte);
        }
        while let Some(&byte) = self.bytes.get(self.at) {
            if !matches!(byte, b' ' | b'\n' | b'\r' | b'\t') {
                return Some(byte);
            }
            self.at += 1;
        }
        None
    }

    /// Consumes `word` (`null`, `true`, `false`), which starts at the cursor.
    pub(crate) fn literal(&mut self, word: &[u8]) -> Result<(), Stop> {
        if self.bytes[self.at..].starts_with(word) {
            self.at += word.len();
            Ok(())
        } else {
            Err(Stop::Syntax)
        }
    }

    /// Consumes the `:` after a key.
    pub(crate) fn colon(&mut self) -> Result<(), Stop> {
        if self.skip_ws() == Some(b':') {
            self.at += 1;
            Ok(())
        } else {
            Err(Stop::Syntax)
        }
    }

    /// Reads the members of an object whose `{` was just consumed, through its `}`.
    /// `member` is called with each key (raw, without escapes) before its colon, and
    /// reads the colon and the value.
    pub(crate) fn members(
        &mut self,
        mut member: impl FnMut(&mut Self, &[u8]) -> Result<(), Stop>,
    ) -> Result<(), Stop> {
        match self.skip_ws() {
            Some(b'}') => {
                self.at += 1;
                return Ok(());
            }
            Some(b'"') => {}
            _ => return Err(Stop::Syntax),
        }
        loop {
            self.at += 1;
            let key = self.plain_str()?;
            member(self, key)?;
            match self.skip_ws() {
                Some(b',') => {
                    self.at += 1;
                    if self.skip_ws() != Some(b'"') {
                        return Err(Stop::Syntax);
                    }
                }
                Some(b'}') => {
                    self.at += 1;
                    return Ok(());
                }
                _ => return Err(Stop::Syntax),
            }
        }
    }

    /// A known member: a data error if seen before (serde's derive checks at the key),
    /// else its colon and value, kept in `slot`.
    pub(crate) fn member_once<T>(
        &mut self,
        slot: &mut Option<T>,
        read: impl FnOnce(&mut Self) -> Result<T, Stop>,
    ) -> Result<(), Stop> {
        if slot.is_some() {
            return Err(Stop::Data);
        }
        self.colon()?;
        *slot = Some(read(self)?);
        Ok(())
    }

    /// An unknown member's colon and value, skipped.
    #[inline(always)]
    pub(crate) fn skip_member_value(&mut self) -> Result<(), Stop> {
        self.colon()?;
        // Most values are strings: skipped here, without a call.
        if self.skip_ws() == Some(b'"') {
            self.at += 1;
            self.skip_string()
        } else {
            self.skip_value()
        }
    }

    /// A non-negative integer starting at the cursor (a digit) that fits a `u64` and has
    /// no fraction or exponent; other numbers are [`Stop::Unsure`].
    pub(crate) fn plain_u64(&mut self) -> Result<u64, Stop> {
        let start = self.at;
        let mut value: u64 = 0;
        while let Some(digit @ b'0'..=b'9') = self.peek() {
            // Cannot overflow within 19 digits; longer numbers are counted again below.
            value = value.wrapping_mul(10).wrapping_add(u64::from(digit - b'0'));
            self.at += 1;
        }
        let digits = &self.bytes[start..self.at];
        if digits.len() > 1 && digits[0] == b'0' {
            // A leading zero.
            return Err(Stop::Syntax);
        }
        if digits.len() > 19 {
            value = digits
                .iter()
                .try_fold(0u64, |value, &digit| {
                    value.checked_mul(10)?.checked_add(u64::from(digit - b'0'))
                })
                .ok_or(Stop::Unsure)?;
        }
        match self.peek() {
            Some(b'.' | b'e' | b'E') => Err(Stop::Unsure),
            _ => Ok(value),
        }
    }

    /// A string read as a `str` (its bytes returned), its opening quote consumed:
    /// without escapes (else [`Stop::Unsure`]), control characters or invalid UTF-8.
    #[inline(always)]
    pub(crate) fn plain_str(&mut self) -> Result<&'a [u8], Stop> {
        let start = self.at;
        self.at = string_stop::<true>(self.bytes, start);
        let ascii = self.peek().is_none_or(|b| b < 0x80);
        if !ascii {
            self.at = string_stop::<false>(self.bytes, self.at);
        }
        match self.peek() {
            Some(b'"') => {
                let text = &self.bytes[start..self.at];
                self.at += 1;
                if !ascii && std::str::from_utf8(text).is_err() {
                    return Err(Stop::Syntax);
                }
                Ok(text)
            }
            Some(b'\\') => Err(Stop::Unsure),
            _ => Err(Stop::Syntax),
        }
    }

    /// A skipped string, its opening quote consumed (serde_json's `ignore_str`).
    #[inline(always)]
    fn skip_string(&mut self) -> Result<(), Stop> {
        loop {
            self.at = string_stop::<false>(self.bytes, self.at);
            match self.peek() {
                Some(b'"') => {
                    self.at += 1;
                    return Ok(());
                }
                Some(b'\\') => {
                    self.at += 1;
                    self.skip_escape()?;
                }
                _ => return Err(Stop::Syntax),
            }
        }
    }

    /// The rest of an escape after its backslash: one of `"\/bfnrt`, or `u` and four hex
    /// digits (any code unit, surrogates unpaired or not).
    #[inline(always)]
    fn skip_escape(&mut self) -> Result<(), Stop> {
        let length = match self.peek() {
            Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => 1,
            Some(b'u') => match self.bytes.get(self.at + 1..self.at + 5) {
                Some(hex) if hex.iter().all(u8::is_ascii_hexdigit) => 5,
                _ => return Err(Stop::Syntax),
            },
            _ => return Err(Stop::Syntax),
        };
        self.at += length;
        Ok(())
    }

    /// A skipped number (serde_json's `ignore_integer`: the JSON grammar, no value).
    fn skip_number(&mut self) -> Result<(), Stop> {
        if self.peek() == Some(b'-') {
            self.at += 1;
        }
        match self.peek() {
            Some(b'0') => {
                self.at += 1;
                if self.peek().is_some_and(|b| b.is_ascii_digit()) {
                    return Err(Stop::Syntax);
                }
            }
            Some(b'1'..=b'9') => self.skip_digits(),
            _ => return Err(Stop::Syntax),
        }
        if self.peek() == Some(b'.') {
            self.at += 1;
            if !self.skip_digits_at_least_one() {
                return Err(Stop::Syntax);
            }
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.at += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.at += 1;
            }
            if !self.skip_digits_at_least_one() {
                return Err(Stop::Syntax);
            }
        }
        Ok(())
    }

    /// Skips `[0-9]*`.
    fn skip_digits(&mut self) {
        while self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.at += 1;
        }
    }

    /// Skips `[0-9]*`; whether there was a digit.
    fn skip_digits_at_least_one(&mut self) -> bool {
        let start = self.at;
        self.skip_digits();
        self.at > start
    }

    /// A skipped value of any kind (serde_json's `ignore_value`).
    pub(crate) fn skip_value(&mut self) -> Result<(), Stop> {
        match self.skip_ws() {
            Some(b'"') => {
                self.at += 1;
                self.skip_string()
            }
            Some(b'[' | b'{') => self.container::<false>(MAX_SKIPPED_DEPTH),
            _ => self.skip_scalar(),
        }
    }

    /// A value of any kind read as serde_json reads it into a `serde_json::Value`, with
    /// at most `max_depth` arrays and objects open at once (deeper is
    /// [`Stop::Unsure`]); returns what `Value::as_u64` returns.
    pub(crate) fn value_as_u64(&mut self, max_depth: usize) -> Result<Option<u64>, Stop> {
        match self.skip_ws() {
            Some(b'"') => {
                self.at += 1;
                self.value_str().map(|()| None)
            }
            Some(b'[' | b'{') => self.container::<true>(max_depth).map(|()| None),
            Some(b'-' | b'0'..=b'9') => self.value_number(),
            _ => self.skip_scalar().map(|()| None),
        }
    }

    /// A skipped number or literal at the cursor.
    fn skip_scalar(&mut self) -> Result<(), Stop> {
        match self.peek() {
            Some(b'-' | b'0'..=b'9') => self.skip_number(),
            Some(b'n') => self.literal(b"null"),
            Some(b't') => self.literal(b"true"),
            Some(b'f') => self.literal(b"false"),
            _ => Err(Stop::Syntax),
        }
    }

    /// An array or object at the cursor, without recursion, with at most `max_depth`
    /// of them open at once (deeper is [`Stop::Unsure`]): skipped, or with `AS_VALUE`
    /// checked as a `serde_json::Value`.
    fn container<const AS_VALUE: bool>(&mut self, max_depth: usize) -> Result<(), Stop> {
        let mut open = OpenContainers::default();
        loop {
            // A value starts here.
            match self.skip_ws() {
                Some(b'"') => {
                    self.at += 1;
                    if AS_VALUE {
                        self.value_str()?;
                    } else {
                        self.skip_string()?;
                    }
                }
                Some(opening @ (b'[' | b'{')) => {
                    self.at += 1;
                    let is_object = opening == b'{';
                    // `]` and `}` are `[` and `{` plus two.
                    if self.skip_ws() == Some(opening + 2) {
                        self.at += 1;
                    } else {
                        open.push(is_object, max_depth)?;
                        if is_object {
                            self.key::<AS_VALUE>()?;
                        }
                        continue;
                    }
                }
                Some(b'-' | b'0'..=b'9') if AS_VALUE => {
                    self.value_number()?;
                }
                _ => self.skip_scalar()?,
            }
            // A value ended: close the containers it ends, then go on to the next element.
            loop {
                let Some(in_object) = open.innermost() else {
                    return Ok(());
                };
                match self.skip_ws() {
                    Some(b',') => {
                        self.at += 1;
                        if in_object {
                            self.key::<AS_VALUE>()?;
                        }
                        break;
                    }
                    Some(b'}') if in_object => open.pop(),
                    Some(b']') if !in_object => open.pop(),
                    _ => return Err(Stop::Syntax),
                }
                self.at += 1;
            }
        }
    }

    /// An object key inside a container, and its colon: skipped (serde_json's
    /// `ignore_value` inside an object), or with `AS_VALUE` read as a `serde_json::Value`
    /// map's `String` key. A `Value` key starting with `$` is [`Stop::Unsure`]:
    /// serde_json reads a map whose first key is one of its private
    /// `$serde_json::private::…` names differently when its `arbitrary_precision` or
    /// `raw_value` feature is on.
    #[inline(always)]
    fn key<const AS_VALUE: bool>(&mut self) -> Result<(), Stop> {
        if self.skip_ws() != Some(b'"') {
            return Err(Stop::Syntax);
        }
        self.at += 1;
        if !AS_VALUE {
            self.skip_string()?;
        } else if self.peek() == Some(b'$') {
            return Err(Stop::Unsure);
        } else {
            self.value_str()?;
        }
        self.colon()
    }

    /// A string read as a `str` into a `serde_json::Value`, its opening quote consumed
    /// (serde_json's `parse_str`): escapes well formed and `\u` surrogates paired, no
    /// control characters, valid UTF-8. UTF-8 is checked on the raw text, escapes
    /// included: they are ASCII and stand for whole characters, so the raw text is valid
    /// exactly when the decoded one is.
    fn value_str(&mut self) -> Result<(), Stop> {
        let start = self.at;
        let mut ascii = true;
        loop {
            self.at = if ascii {
                string_stop::<true>(self.bytes, self.at)
            } else {
                string_stop::<false>(self.bytes, self.at)
            };
            match self.peek() {
                Some(b'"') => break,
                Some(b'\\') => {
                    self.at += 1;
                    self.value_escape()?;
                }
                Some(0x80..) => ascii = false,
                _ => return Err(Stop::Syntax),
            }
        }
        let text = &self.bytes[start..self.at];
        self.at += 1;
        if !ascii && std::str::from_utf8(text).is_err() {
            return Err(Stop::Syntax);
        }
        Ok(())
    }

    /// The rest of an escape in a string read into a `serde_json::Value`, after its
    /// backslash: as a skipped one, and a `\u` surrogate must be a leading one followed
    /// by a `\u` trailing one (serde_json's `parse_unicode_escape`).
    fn value_escape(&mut self) -> Result<(), Stop> {
        if self.peek() != Some(b'u') {
            return self.skip_escape();
        }
        match self.code_unit()? {
            0xD800..=0xDBFF => {
                if self.peek() != Some(b'\\') {
                    return Err(Stop::Syntax);
                }
                self.at += 1;
                if self.peek() != Some(b'u') {
                    return Err(Stop::Syntax);
                }
                match self.code_unit()? {
                    0xDC00..=0xDFFF => Ok(()),
                    _ => Err(Stop::Syntax),
                }
            }
            0xDC00..=0xDFFF => Err(Stop::Syntax),
            _ => Ok(()),
        }
    }

    /// A `u` at the cursor and the four hex digits after it: the UTF-16 code unit
    /// they spell.
    fn code_unit(&mut self) -> Result<u32, Stop> {
        let hex = self
            .bytes
            .get(self.at + 1..self.at + 5)
            .ok_or(Stop::Syntax)?;
        let unit = hex
            .iter()
            .try_fold(0, |unit, &digit| {
                char::from(digit)
                    .to_digit(16)
                    .map(|digit| unit << 4 | digit)
            })
            .ok_or(Stop::Syntax)?;
        self.at += 5;
        Ok(unit)
    }

    /// A number read into a `serde_json::Value` (serde_json without its
    /// `arbitrary_precision` feature): returns its `as_u64`, `Some` for a non-negative
    /// integer that fits a `u64`, `None` for a negative one or one with a fraction (held
    /// as an `i64` or an `f64`; `-0` is the `f64` `-0.0`). An exponent or more than 19
    /// integer digits (other than a `u64`) is [`Stop::Unsure`]: the `f64` may overflow
    /// then, a syntax error in serde_json.
    fn value_number(&mut self) -> Result<Option<u64>, Stop> {
        let start = self.at;
        if self.peek() != Some(b'-') {
            // The common case, in one pass.
            match self.plain_u64() {
                Ok(value) => return Ok(Some(value)),
                Err(Stop::Unsure) => self.at = start,
                Err(stop) => return Err(stop),
            }
        }
        self.skip_number()?;
        let number = &self.bytes[start..self.at];
        let integer_digits = number
            .iter()
            .skip_while(|&&byte| byte == b'-')
            .take_while(|byte| byte.is_ascii_digit())
            .count();
        if integer_digits > 19 || number.iter().any(|&byte| byte == b'e' || byte == b'E') {
            return Err(Stop::Unsure);
        }
        Ok(None)
    }
}

/// The arrays and objects a value is inside, innermost last: one bit each (set
/// for an object), up to [`MAX_SKIPPED_DEPTH`].
#[derive(Default)]
struct OpenContainers {
    bits: [u64; MAX_SKIPPED_DEPTH / 64],
    depth: usize,
}

impl OpenContainers {
    /// Opens an object (`object`) or an array; [`Stop::Unsure`] past `max_depth` or
    /// [`MAX_SKIPPED_DEPTH`].
    fn push(&mut self, object: bool, max_depth: usize) -> Result<(), Stop> {
        let word = match self.bits.get_mut(self.depth / 64) {
            Some(word) if self.depth < max_depth => word,
            _ => return Err(Stop::Unsure),
        };
        let bit = 1u64 << (self.depth % 64);
        if object {
            *word |= bit;
        } else {
            *word &= !bit;
        }
        self.depth += 1;
        Ok(())
    }

    /// Closes the innermost container.
    fn pop(&mut self) {
        self.depth -= 1;
    }

    /// Whether the innermost open container is an object; `None` when none is open.
    fn innermost(&self) -> Option<bool> {
        let top = self.depth.checked_sub(1)?;
        Some(self.bits[top / 64] >> (top % 64) & 1 == 1)
    }
}

/// The index of the first `"`, `\` or control character (U+0000 to U+001F) at or after
/// `from`, or `bytes.len()`: the end of a run of plain string bytes; with `ASCII_ONLY`,
/// of plain ASCII bytes. Eight bytes at a time (Mycroft's zero-byte test, as
/// serde_json's `skip_to_escape`).
#[inline(always)]
fn string_stop<const ASCII_ONLY: bool>(bytes: &[u8], from: usize) -> usize {
    const ONES: u64 = u64::MAX / 255;
    const HIGH_BITS: u64 = ONES << 7;
    let mut at = from;
    let chunks_end = bytes.len().saturating_sub(7);
    while at < chunks_end {
        let mut chunk = [0; 8];
        chunk.copy_from_slice(&bytes[at..at + 8]);
        let word = u64::from_le_bytes(chunk);
        // Flipping bit 1 keeps the control characters below 0x20 and brings `"` (0x22)
        // to 0x20: one test finds both, bytes below 0x21.
        let flipped = word ^ (ONES * 0x02);
        let control_or_quote = flipped.wrapping_sub(ONES * 0x21) & !flipped;
        let backslash = word ^ (ONES * u64::from(b'\\'));
        let backslash = backslash.wrapping_sub(ONES) & !backslash;
        let non_ascii = if ASCII_ONLY { word } else { 0 };
        let found = (control_or_quote | backslash | non_ascii) & HIGH_BITS;
        if found != 0 {
            // The lowest flagged byte is exact (a false positive needs a borrow from a
            // real match below it).
            return at + found.trailing_zeros() as usize / 8;
        }
        at += 8;
    }
    while let Some(&byte) = bytes.get(at) {
        if byte == b'"' || byte == b'\\' || byte < 0x20 || (ASCII_ONLY && byte >= 0x80) {
            return at;
        }
        at += 1;
    }
    at
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// [`string_stop`] byte by byte.
    fn naive_string_stop(bytes: &[u8], from: usize, ascii_only: bool) -> usize {
        (from..bytes.len())
            .find(|&at| {
                let byte = bytes[at];
                byte == b'"' || byte == b'\\' || byte < 0x20 || (ascii_only && byte >= 0x80)
            })
            .unwrap_or(bytes.len())
    }

    /// Plain string bytes, mostly, and some that stop a run.
    fn string_byte() -> impl Strategy<Value = u8> {
        prop_oneof![
            40 => b' '..=b'~',
            1 => prop::sample::select(&b"\"\\\x00\x1f\x20\x7f\x80\xc3\xff"[..]),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// The word scan finds the first stop at every offset and length.
        #[test]
        fn string_stop_finds_the_first_stop(
            bytes in prop::collection::vec(string_byte(), 0..100),
            from in any::<prop::sample::Index>(),
        ) {
            let from = from.index(bytes.len() + 1);
            let naive = |ascii_only| naive_string_stop(&bytes, from, ascii_only);
            prop_assert_eq!(string_stop::<false>(&bytes, from), naive(false));
            prop_assert_eq!(string_stop::<true>(&bytes, from), naive(true));
        }
    }

    #[test]
    fn string_stop_finds_each_stop_at_each_position() {
        for length in 0..24 {
            for stop in [b'"', b'\\', 0x00, 0x1f, 0x80, 0xff] {
                for at in 0..length {
                    let mut bytes = vec![b'a'; length];
                    bytes[at] = stop;
                    assert_stops_agree(&bytes);
                }
            }
        }
    }

    /// Every pair of bytes, side by side at the start, middle and end of a word: a stop
    /// flagged by a borrow from the byte below it is never the first one found.
    #[test]
    fn string_stop_finds_the_first_of_every_pair_of_bytes() {
        for at in [0, 3, 6] {
            for pair in 0..=u16::MAX {
                let mut bytes = [b'a'; 8];
                bytes[at..at + 2].copy_from_slice(&pair.to_le_bytes());
                assert_stops_agree(&bytes);
            }
        }
    }

    fn assert_stops_agree(bytes: &[u8]) {
        assert_eq!(
            string_stop::<false>(bytes, 0),
            naive_string_stop(bytes, 0, false),
            "{bytes:?}"
        );
        assert_eq!(
            string_stop::<true>(bytes, 0),
            naive_string_stop(bytes, 0, true),
            "{bytes:?}"
        );
    }
}
