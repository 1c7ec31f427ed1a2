//! One name table per enum: [`named_enum!`] derives the list of values, their names,
//! `Display` and `FromStr` from a single `Variant => "name"` list, so the spelling a user
//! types, the one outputs print and the one errors suggest cannot drift apart.

/// An enum with one name table (implemented by [`named_enum!`]), for code generic over
/// such enums (a command-line parser listing the names).
pub trait Named: Sized + Copy + Send + Sync + 'static {
    /// Every value's name.
    const NAMES: &'static [&'static str];
    /// The value named `name`, if any.
    fn from_name(name: &str) -> Option<Self>;
}

/// Gives a fieldless enum `ALL`, `NAMES`, `name()`, `Display` and `FromStr` (whose error
/// names the kind of value and lists every name) from one table.
///
/// ```
/// #[derive(Debug, Clone, Copy, PartialEq, Eq)]
/// enum Colour { Red, DarkBlue }
/// infersched_core::named_enum!(Colour, "colour", { Red => "red", DarkBlue => "dark-blue" });
/// assert_eq!(Colour::DarkBlue.name(), "dark-blue");
/// assert_eq!(Colour::DarkBlue.to_string(), "dark-blue");
/// assert_eq!("red".parse::<Colour>(), Ok(Colour::Red));
/// assert_eq!(Colour::ALL, &[Colour::Red, Colour::DarkBlue]);
/// assert_eq!(
///     "green".parse::<Colour>().unwrap_err(),
///     "unknown colour \"green\"; expected one of red, dark-blue"
/// );
/// ```
// rustc's missing_docs misses the doc of an exported macro defined in a submodule.
#[allow(missing_docs)]
#[macro_export]
macro_rules! named_enum {
    ($ty:ident, $what:literal, { $($variant:ident => $name:literal),+ $(,)? }) => {
        impl $ty {
            /// Every value, in declaration order.
            pub const ALL: &'static [$ty] = &[$($ty::$variant),+];
            /// Every value's name, in the order of `ALL`.
            pub const NAMES: &'static [&'static str] = &[$($name),+];

            /// The name flags take and outputs print.
            pub fn name(self) -> &'static str {
                match self {
                    $($ty::$variant => $name),+
                }
            }
        }

        impl $crate::names::Named for $ty {
            const NAMES: &'static [&'static str] = $ty::NAMES;
            fn from_name(name: &str) -> Option<Self> {
                match name {
                    $($name => Some($ty::$variant),)+
                    _ => None,
                }
            }
        }

        impl ::std::fmt::Display for $ty {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.name())
            }
        }

        impl ::std::str::FromStr for $ty {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                match s {
                    $($name => Ok($ty::$variant),)+
                    _ => Err(format!(
                        "unknown {} \"{}\"; expected one of {}",
                        $what,
                        s,
                        Self::NAMES.join(", ")
                    )),
                }
            }
        }
    };
}
