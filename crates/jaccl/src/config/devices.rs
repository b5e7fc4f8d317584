//! The RDMA device matrix: which local device each rank uses to reach each other rank.
//!
//! The format is upstream's (`MLX_IBV_DEVICES`, written by `mlx.distributed_config`): a JSON
//! list of N rows of N entries; entry `[i][j]` is `null` (no cable), a device name, or a list
//! of names (several wires), and the diagonal is `null`.

use std::fmt;

use serde_json::Value;

/// An N × N matrix of RDMA device names, upstream's `MLX_IBV_DEVICES` file: entry `[i][j]` is
/// the device rank i uses to reach rank j, `null` on the diagonal (and where no cable runs), a
/// list of names for several wires.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceMatrix {
    rows: Vec<Vec<Vec<String>>>,
}

impl DeviceMatrix {
    /// Parses the JSON text of a device file.
    ///
    /// # Errors
    /// Every problem found, each naming the cell (`[i][j]`) and what is wrong.
    pub fn from_json(text: &str) -> Result<DeviceMatrix, Vec<String>> {
        let value: Value =
            serde_json::from_str(text).map_err(|e| vec![format!("not valid JSON: {e}")])?;
        DeviceMatrix::from_value(&value)
    }

    /// Reads a device matrix from parsed JSON (as a hostfile's `rdma` lists, one per host).
    ///
    /// # Errors
    /// As [`DeviceMatrix::from_json`].
    pub fn from_value(value: &Value) -> Result<DeviceMatrix, Vec<String>> {
        let Some(rows) = value.as_array() else {
            return Err(vec![format!(
                "expected a list of rows (one per rank), found {}",
                shown(value)
            )]);
        };
        let n = rows.len();
        let mut errors = Vec::new();
        if n == 0 {
            errors.push("the matrix has no rows".to_string());
        }
        let mut matrix = Vec::with_capacity(n);
        for (i, row) in rows.iter().enumerate() {
            let Some(row) = row.as_array() else {
                errors.push(format!(
                    "[{i}]: row {i} must be a list of {n} entries, found {}",
                    shown(row)
                ));
                matrix.push(vec![Vec::new(); n]);
                continue;
            };
            if row.len() != n {
                errors.push(format!(
                    "[{i}]: row {i} has {} entries; the matrix must be {n} × {n}",
                    row.len()
                ));
            }
            let entries = row.iter().enumerate().map(|(j, v)| {
                let names = entry(v).unwrap_or_else(|why| {
                    errors.push(format!("[{i}][{j}]: {why}"));
                    Vec::new()
                });
                if i == j && !names.is_empty() {
                    errors.push(format!(
                        "[{i}][{j}]: a rank has no device to itself; expected null, found {v}"
                    ));
                }
                names
            });
            matrix.push(entries.collect());
        }
        if errors.is_empty() {
            Ok(DeviceMatrix { rows: matrix })
        } else {
            Err(errors)
        }
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.rows.len()
    }

    /// The devices rank `i` uses to reach rank `j` (empty: none).
    pub fn devices(&self, i: usize, j: usize) -> &[String] {
        self.rows
            .get(i)
            .and_then(|row| row.get(j))
            .map_or(&[], Vec::as_slice)
    }

    /// The topology the matrix supports: "mesh" when every pair is cabled, "ring, k wire(s)"
    /// when every rank reaches both neighbours with k devices.
    ///
    /// # Errors
    /// Why it supports neither: the pairs that lack a device.
    pub fn topology(&self) -> Result<String, String> {
        let n = self.size();
        if n < 2 {
            return Err("a device matrix needs at least 2 ranks".into());
        }
        if (0..n).all(|i| (0..n).all(|j| i == j || !self.devices(i, j).is_empty())) {
            return Ok("mesh (every pair of ranks is cabled)".into());
        }
        match self.ring_wires() {
            Ok(k) => Ok(format!("ring, {k} wire{}", if k == 1 { "" } else { "s" })),
            Err(why) => Err(format!(
                "neither a mesh (all pairs cabled) nor a ring: {why}"
            )),
        }
    }

    /// The wires of a ring over this matrix: the number of devices every rank has towards
    /// each neighbour.
    ///
    /// # Errors
    /// The first cell where a rank lacks devices towards a neighbour, or has another count.
    pub fn ring_wires(&self) -> Result<usize, String> {
        let n = self.size();
        let k = self.devices(0, 1 % n).len();
        for i in 0..n {
            for j in [(i + 1) % n, (i + n - 1) % n] {
                let got = self.devices(i, j).len();
                if got == 0 || got != k {
                    let want = if got == 0 {
                        "a device".to_string()
                    } else {
                        format!("{k} device(s), as [0][1]")
                    };
                    return Err(format!(
                        "[{i}][{j}]: ring neighbours need {want}, found {got}"
                    ));
                }
            }
        }
        Ok(k)
    }
}

impl fmt::Display for DeviceMatrix {
    /// The matrix as JSON, in the file format.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let value: Vec<Vec<Value>> = self
            .rows
            .iter()
            .map(|row| {
                row.iter()
                    .map(|names| match names.as_slice() {
                        [] => Value::Null,
                        [one] => Value::String(one.clone()),
                        many => Value::Array(many.iter().cloned().map(Value::String).collect()),
                    })
                    .collect()
            })
            .collect();
        f.write_str(&Value::from(value).to_string())
    }
}

/// One entry: `null`, a name, or a list of names.
fn entry(v: &Value) -> Result<Vec<String>, String> {
    match v {
        Value::Null => Ok(Vec::new()),
        Value::String(s) if !s.trim().is_empty() => Ok(vec![s.trim().to_string()]),
        Value::Array(list) => list
            .iter()
            .map(|d| match d.as_str() {
                Some(s) if !s.trim().is_empty() => Ok(s.trim().to_string()),
                _ => Err(format!(
                    "device names must be non-empty strings, found {}",
                    shown(d)
                )),
            })
            .collect(),
        Value::String(_) => Err("a device name is empty".into()),
        other => Err(format!(
            "expected null, a device name or a list of names, found {}",
            shown(other)
        )),
    }
}

/// A value as an error message shows it: its JSON, cut short.
fn shown(v: &Value) -> String {
    let text = v.to_string();
    match text.char_indices().nth(40) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_upstream_files_and_names_bad_cells() {
        let m = DeviceMatrix::from_json(
            r#"[[null, "rxe0", ["a", "b"]], ["rxe0", null, "c"], [["a", "b"], "c", null]]"#,
        )
        .unwrap();
        assert_eq!(m.size(), 3);
        assert_eq!(m.devices(0, 2), ["a", "b"]);
        assert_eq!(m.devices(1, 1), [] as [String; 0]);
        assert_eq!(
            m.topology().unwrap(),
            "mesh (every pair of ranks is cabled)"
        );
        assert_eq!(DeviceMatrix::from_json(&m.to_string()).unwrap(), m);

        let errors = DeviceMatrix::from_json(r#"[[null, 3], ["x", "y"], [null]]"#)
            .unwrap_err()
            .join("\n");
        assert!(errors.contains("[0]: row 0 has 2 entries"), "{errors}");
        assert!(
            errors.contains("[0][1]: expected null, a device name"),
            "{errors}"
        );
        assert!(
            errors.contains("[1][1]: a rank has no device to itself"),
            "{errors}"
        );
        assert!(DeviceMatrix::from_json("{").unwrap_err()[0].contains("JSON"));
        assert!(DeviceMatrix::from_json("[]").is_err());
    }

    #[test]
    fn ring_wires_need_every_neighbour_cabled_alike() {
        let ring = DeviceMatrix::from_json(
            r#"[[null, ["a","b"], ["c","d"], null], [["a","b"], null, ["e","f"], null],
                [null, ["e","f"], null, ["g","h"]], [["c","d"], null, ["g","h"], null]]"#,
        );
        // Rank 0's neighbours are 1 and 3, but it names 2: not a ring.
        let err = ring.unwrap().ring_wires().unwrap_err();
        assert!(err.contains("[0][3]"), "{err}");
        let ring = DeviceMatrix::from_json(
            r#"[[null, ["a","b"], null, ["c","d"]], [["a","b"], null, ["e","f"], null],
                [null, ["e","f"], null, ["g","h"]], [["c","d"], null, ["g","h"], null]]"#,
        )
        .unwrap();
        assert_eq!(ring.ring_wires(), Ok(2));
        assert_eq!(ring.topology().unwrap(), "ring, 2 wires");
    }
}
