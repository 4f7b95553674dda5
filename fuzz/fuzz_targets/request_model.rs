//! Fuzzes request parsing and the model override (`inspect_request`,
//! `override_model`): any body must be accepted or refused without a panic; a body that
//! is accepted must take any model override, and the rewritten body must read back with
//! exactly that model, the same `stream` flag, and every other byte unchanged.
#![no_main]

use keypool_providers::{inspect_request, override_model};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // first byte: length of the override model (taken from the end of the input)
    let Some((&n, rest)) = data.split_first() else {
        return;
    };
    let split = rest.len().saturating_sub(usize::from(n));
    let (body, model) = rest.split_at(split);
    let model = String::from_utf8_lossy(model);
    let Ok(info) = inspect_request(body) else {
        // refused bodies may still be fed to the override (never a panic)
        let _ = override_model(body, &model);
        return;
    };
    let rewritten = override_model(body, &model).expect("an accepted body takes an override");
    let again = inspect_request(&rewritten).expect("the rewritten body is still accepted");
    assert_eq!(again.model, model, "the override's model is read back");
    assert_eq!(again.stream, info.stream, "the stream flag is unchanged");
    // overriding with the original model gives the original bytes back when the body
    // spells it canonically (serde_json's own escaping)
    let same = override_model(body, &info.model).expect("override with the same model");
    let canonical = serde_json::to_string(&info.model).expect("a string serialises");
    let count = body
        .windows(canonical.len())
        .filter(|w| *w == canonical.as_bytes())
        .count();
    if count >= 1 && same.len() == body.len() {
        assert_eq!(&same[..], body, "a same-length override with the same model is a no-op");
    }
});
