//! `[server] admin_token_file` / `admin_token_env`: the bearer token the
//! admin listener asks of every request but `GET /healthz`, `/readyz` and
//! `/metrics` (see `admin::auth`).
//!
//! The token is read when the configuration is loaded, so a reload reads
//! the file (or the variable) again, and a file that is missing or empty
//! then fails the reload like any other invalid configuration: the running
//! token stays. It is a [`Secret`] from the moment it is read: no `Debug`,
//! error, `check` summary or log line carries it; errors name the file or
//! the variable, never what they hold.

use std::path::Path;

use super::Secret;
use super::checker::Checker;
use super::error::KeyPath;
use super::server::RawServer;

/// The admin token of `[server]`, or `None` when neither key is given.
pub(super) fn check_admin_token(
    c: &mut Checker,
    path: &KeyPath,
    raw: &RawServer,
    directory: &Path,
) -> Option<Secret> {
    let read = match (&raw.admin_token_file, &raw.admin_token_env) {
        (Some(_), Some(_)) => {
            c.problem(
                path.key("admin_token_env"),
                "`admin_token_file` and `admin_token_env` are two sources of one token: give one",
            );
            return None;
        }
        (Some(file), None) => {
            read_file(&directory.join(file)).map_err(|message| ("admin_token_file", message))
        }
        (None, Some(name)) => read_env(name).map_err(|message| ("admin_token_env", message)),
        (None, None) => return None,
    };
    let token = read
        .and_then(|token| match check_text(&token) {
            Ok(()) => Ok(token),
            Err(message) if raw.admin_token_file.is_some() => Err(("admin_token_file", message)),
            Err(message) => Err(("admin_token_env", message)),
        })
        .map_err(|(key, message)| c.problem(path.key(key), message))
        .ok()?;
    if raw.admin.is_none() {
        c.problem(
            path.key("admin"),
            "an admin token needs the admin listener: set `admin = \"127.0.0.1:9091\"` too",
        );
    }
    Some(Secret::new(&token))
}

/// The token in `file`: its content without one trailing newline (`\n` or
/// `\r\n`, as `echo` and editors leave it).
fn read_file(file: &Path) -> Result<String, String> {
    let bytes = std::fs::read(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    let text =
        String::from_utf8(bytes).map_err(|_| format!("{} is not UTF-8 text", file.display()))?;
    let text = text.strip_suffix('\n').unwrap_or(&text);
    let text = text.strip_suffix('\r').unwrap_or(text);
    if text.is_empty() {
        return Err(format!(
            "{} is empty: write the admin token into it",
            file.display()
        ));
    }
    Ok(text.to_owned())
}

/// The token in the environment variable `name`.
fn read_env(name: &str) -> Result<String, String> {
    match std::env::var(name) {
        Ok(value) if !value.is_empty() => Ok(value),
        Ok(_) => Err(format!("the environment variable `{name}` is empty")),
        Err(std::env::VarError::NotPresent) => Err(format!(
            "the environment variable `{name}` is not set: export it to the gateway's environment, or use `admin_token_file`"
        )),
        Err(std::env::VarError::NotUnicode(_)) => {
            Err(format!("the environment variable `{name}` is not UTF-8"))
        }
    }
}

/// A token a client can send as `Authorization: Bearer TOKEN`: visible
/// ASCII without spaces (a header value cannot carry more, and a space
/// would end the credentials).
fn check_text(token: &str) -> Result<(), String> {
    if token.bytes().all(|b| b.is_ascii_graphic()) {
        Ok(())
    } else {
        Err("the admin token must be visible ASCII without spaces (it is sent as `Authorization: Bearer TOKEN`)".to_owned())
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::Config;

    fn load(directory: &Path, text: &str) -> Result<Config, String> {
        Config::from_bytes(&directory.join("gateway.toml"), text.as_bytes())
            .map_err(|e| e.to_string())
    }

    fn directory(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "tollgate-admin-token-{name}-{}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        dir
    }

    #[test]
    fn a_token_file_is_read_relative_to_the_config_and_never_printed() {
        let dir = directory("file");
        std::fs::write(dir.join("admin.token"), "s3cr3t-token\n").unwrap_or_else(|e| panic!("{e}"));
        let config = load(
            &dir,
            "[server]\nadmin = \"127.0.0.1:0\"\nadmin_token_file = \"admin.token\"\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let token = config.server.admin_token.as_ref().map(|t| t.expose());
        assert_eq!(token, Some("s3cr3t-token"));
        assert!(!format!("{config:?}").contains("s3cr3t"));
        assert!(!crate::summary::render(&config).contains("s3cr3t"));
    }

    #[test]
    fn both_sources_missing_files_empty_files_and_spaces_are_errors() {
        let dir = directory("errors");
        let both = load(
            &dir,
            "[server]\nadmin = \"127.0.0.1:0\"\nadmin_token_file = \"a\"\nadmin_token_env = \"B\"\n",
        )
        .err()
        .unwrap_or_default();
        assert!(both.contains("`server.admin_token_env`"), "{both}");
        assert!(both.contains("give one"), "{both}");
        let missing = load(
            &dir,
            "[server]\nadmin = \"127.0.0.1:0\"\nadmin_token_file = \"nope.token\"\n",
        )
        .err()
        .unwrap_or_default();
        assert!(missing.contains("`server.admin_token_file`"), "{missing}");
        assert!(missing.contains("nope.token"), "{missing}");
        std::fs::write(dir.join("empty.token"), "\n").unwrap_or_else(|e| panic!("{e}"));
        let empty = load(
            &dir,
            "[server]\nadmin = \"127.0.0.1:0\"\nadmin_token_file = \"empty.token\"\n",
        )
        .err()
        .unwrap_or_default();
        assert!(empty.contains("is empty"), "{empty}");
        std::fs::write(dir.join("spaced.token"), "two words").unwrap_or_else(|e| panic!("{e}"));
        let spaced = load(
            &dir,
            "[server]\nadmin = \"127.0.0.1:0\"\nadmin_token_file = \"spaced.token\"\n",
        )
        .err()
        .unwrap_or_default();
        assert!(spaced.contains("visible ASCII"), "{spaced}");
        assert!(!spaced.contains("two words"), "{spaced}");
    }

    #[test]
    fn an_unset_variable_is_named_and_a_token_needs_the_admin_listener() {
        let dir = directory("env");
        let unset = load(
            &dir,
            "[server]\nadmin = \"127.0.0.1:0\"\nadmin_token_env = \"TOLLGATE_TEST_NO_SUCH_VARIABLE\"\n",
        )
        .err()
        .unwrap_or_default();
        assert!(unset.contains("TOLLGATE_TEST_NO_SUCH_VARIABLE"), "{unset}");
        std::fs::write(dir.join("admin.token"), "t").unwrap_or_else(|e| panic!("{e}"));
        let no_admin = load(&dir, "[server]\nadmin_token_file = \"admin.token\"\n")
            .err()
            .unwrap_or_default();
        assert!(no_admin.contains("needs the admin listener"), "{no_admin}");
    }
}
