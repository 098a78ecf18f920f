//! The msgpack a batch of decisions is sent in (`stack.lua` reads it with
//! `cmsgpack.unpack`, no `tonumber` per value): integers, floats and
//! strings one after the other, behind an array header past
//! `script::STREAM_MAX` values.

/// A float64.
pub(super) fn float(out: &mut Vec<u8>, v: f64) {
    out.push(0xcb);
    out.extend_from_slice(&v.to_bits().to_be_bytes());
}

/// A string (raw bytes).
pub(super) fn string(out: &mut Vec<u8>, text: &str) {
    let n = text.len();
    if n < 32 {
        out.push(0xa0 | n as u8);
    } else if let Ok(n) = u8::try_from(n) {
        out.extend_from_slice(&[0xd9, n]);
    } else if let Ok(n) = u16::try_from(n) {
        out.push(0xda);
        out.extend_from_slice(&n.to_be_bytes());
    } else {
        out.push(0xdb);
        out.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_be_bytes());
    }
    out.extend_from_slice(text.as_bytes());
}

/// An array header for `n` items.
pub(super) fn array(out: &mut Vec<u8>, n: usize) {
    if n < 16 {
        out.push(0x90 | n as u8);
    } else if let Ok(n) = u16::try_from(n) {
        out.push(0xdc);
        out.extend_from_slice(&n.to_be_bytes());
    } else {
        out.push(0xdd);
        out.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_be_bytes());
    }
}

/// An integer, in its shortest form.
pub(super) fn int(out: &mut Vec<u8>, v: i64) {
    if (0..128).contains(&v) {
        out.push(v as u8);
    } else if (-32..0).contains(&v) {
        out.push(v as i8 as u8);
    } else if v >= 0 {
        if let Ok(v) = u8::try_from(v) {
            out.extend_from_slice(&[0xcc, v]);
        } else if let Ok(v) = u16::try_from(v) {
            out.push(0xcd);
            out.extend_from_slice(&v.to_be_bytes());
        } else if let Ok(v) = u32::try_from(v) {
            out.push(0xce);
            out.extend_from_slice(&v.to_be_bytes());
        } else {
            out.push(0xcf);
            out.extend_from_slice(&(v as u64).to_be_bytes());
        }
    } else if let Ok(v) = i8::try_from(v) {
        out.extend_from_slice(&[0xd0, v as u8]);
    } else if let Ok(v) = i16::try_from(v) {
        out.push(0xd1);
        out.extend_from_slice(&v.to_be_bytes());
    } else if let Ok(v) = i32::try_from(v) {
        out.push(0xd2);
        out.extend_from_slice(&v.to_be_bytes());
    } else {
        out.push(0xd3);
        out.extend_from_slice(&v.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn msgpack_integers_take_their_shortest_form() {
        let packed = |v: i64| {
            let mut out = Vec::new();
            int(&mut out, v);
            out
        };
        assert_eq!(packed(0), [0]);
        assert_eq!(packed(127), [0x7f]);
        assert_eq!(packed(128), [0xcc, 0x80]);
        assert_eq!(packed(-1), [0xff]);
        assert_eq!(packed(-32), [0xe0]);
        assert_eq!(packed(-33), [0xd0, 0xdf]);
        assert_eq!(packed(65_536), [0xce, 0, 1, 0, 0]);
        assert_eq!(packed(i64::MAX)[0], 0xcf);
        assert_eq!(packed(i64::MIN)[0], 0xd3);
        let mut out = Vec::new();
        array(&mut out, 16);
        assert_eq!(out, [0xdc, 0, 16]);
    }
}
