//! Report types declared once: `worded!` (an enum with data: its codes, and its JSON as `{code, text, fields}`) and `reported!` (a struct whose JSON adds what it computes), with the field serializers they name.
//!
//! NOTE: serde's derive cannot add a key that is no field (an enum's `text`, a report's
//! `gib_per_s`), so each macro derives `Serialize` on a private twin that borrows the fields.

/// Declares a report enum with data: the enum, `as_str` from each variant's `= "code"`, and
/// (feature `serde`) its JSON: `code`, `text` (`Display`) and its fields. A field's
/// `=> key = "fn"` is a serde attribute of its JSON only. Exported for the plug-in crates.
#[doc(hidden)]
#[macro_export]
macro_rules! worded {
    (
        $(#[$attr:meta])*
        pub enum $name:ident {
            $(
                $(#[$vattr:meta])*
                $variant:ident $({
                    $(
                        $(#[$fattr:meta])*
                        $field:ident : $fty:ty $(=> $k:ident = $v:literal)?
                    ),* $(,)?
                })? = $code:literal
            ),* $(,)?
        }
    ) => {
        $(#[$attr])*
        pub enum $name {
            $(
                $(#[$vattr])*
                $variant $({ $( $(#[$fattr])* $field: $fty ),* })?
            ),*
        }

        impl $name {
            #[doc = concat!(
                "A stable name for the variant, for logs and JSON (its `code`); in the \
                 order of the variants:", $(" `", $code, "`",)* "."
            )]
            pub fn as_str(&self) -> &'static str {
                match self {
                    $( $name::$variant { .. } => $code, )*
                }
            }
        }

        #[cfg(feature = "serde")]
        const _: () = {
            #[derive(serde::Serialize)]
            #[serde(tag = "code")]
            enum Json<'a> {
                $(
                    #[serde(rename = $code)]
                    $variant {
                        text: String,
                        $($( $(#[serde($k = $v)])? $field: &'a $fty, )*)?
                    },
                )*
                #[serde(skip)]
                #[allow(dead_code)]
                Never(std::marker::PhantomData<&'a ()>),
            }

            impl serde::Serialize for $name {
                fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                    let text = self.to_string();
                    match self {
                        $(
                            $name::$variant { $($($field,)*)? } => {
                                Json::$variant { text, $($($field,)*)? }
                            }
                        )*
                    }
                    .serialize(serializer)
                }
            }
        };
    };
}

/// Declares a report struct and (feature `serde`) its JSON: its fields, then each value it
/// computes under its method's name (`computed { gib_per_s: Option<f64> }`).
macro_rules! reported {
    (
        $(#[$attr:meta])*
        pub struct $name:ident {
            $(
                $(#[$fattr:meta])*
                pub $field:ident : $fty:ty $(=> $k:ident = $v:literal)?
            ),* $(,)?
        }
        computed { $($cname:ident : $cty:ty),* $(,)? }
    ) => {
        $(#[$attr])*
        pub struct $name {
            $( $(#[$fattr])* pub $field: $fty ),*
        }

        #[cfg(feature = "serde")]
        const _: () = {
            #[derive(serde::Serialize)]
            struct Json<'a> {
                $( $(#[serde($k = $v)])? $field: &'a $fty, )*
                $( $cname: $cty, )*
            }

            impl serde::Serialize for $name {
                fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                    Json {
                        $( $field: &self.$field, )*
                        $( $cname: self.$cname(), )*
                    }
                    .serialize(serializer)
                }
            }
        };
    };
}

/// A path in JSON: its text, lossy where not UTF-8 (serde's own refuses the whole report).
#[cfg(feature = "serde")]
pub fn path_text<S: serde::Serializer>(
    path: &std::path::Path,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.collect_str(&path.display())
}

/// An optional path in JSON: its text as [`path_text`] writes it, or `null`.
#[cfg(feature = "serde")]
pub fn maybe_path_text<S: serde::Serializer>(
    path: &Option<std::path::PathBuf>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match path {
        Some(path) => path_text(path, serializer),
        None => serializer.serialize_none(),
    }
}

/// Paths by name in JSON: an object of each path's text, or `null`.
#[cfg(feature = "serde")]
pub(crate) fn path_map<S: serde::Serializer>(
    map: &std::collections::BTreeMap<String, Option<std::path::PathBuf>>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    let text = |path: &Option<std::path::PathBuf>| path.as_ref().map(|p| p.display().to_string());
    serializer.collect_map(map.iter().map(|(name, path)| (name, text(path))))
}

/// A duration in JSON: seconds, as a float.
#[cfg(feature = "serde")]
pub fn seconds<S: serde::Serializer>(
    duration: &std::time::Duration,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.serialize_f64(duration.as_secs_f64())
}

/// For `skip_serializing_if`: a field JSON never has.
#[cfg(feature = "serde")]
pub(crate) fn always<T: ?Sized>(_: &T) -> bool {
    true
}
