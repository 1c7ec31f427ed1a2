//! The optimal scheduler: the InferMax-style MILP of `milp.md`, solved with HiGHS
//! through good_lp.
//!
//! Not built yet (tracked as its own issue). The crate already links HiGHS so that every
//! build and CI run proves the toolchain (cmake, libclang) works; the test below solves a
//! small integer program through the same path the MILP will use.

#[cfg(test)]
mod tests {
    use good_lp::{Solution, SolverModel, constraint, highs, variable, variables};

    #[test]
    fn highs_solves_a_small_integer_program() {
        // max 5x + 4y + 3z  s.t. 2x + 3y + z <= 5, 4x + y + 2z <= 11, 3x + 4y + 2z <= 8,
        // x, y, z integer >= 0. Optimum 13 at (2, 0, 1).
        let mut vars = variables!();
        let x = vars.add(variable().integer().min(0));
        let y = vars.add(variable().integer().min(0));
        let z = vars.add(variable().integer().min(0));
        let solution = vars
            .maximise(5 * x + 4 * y + 3 * z)
            .using(highs)
            .with(constraint!(2 * x + 3 * y + z <= 5))
            .with(constraint!(4 * x + y + 2 * z <= 11))
            .with(constraint!(3 * x + 4 * y + 2 * z <= 8))
            .solve()
            .unwrap();
        assert_eq!(
            (
                solution.value(x).round(),
                solution.value(y).round(),
                solution.value(z).round()
            ),
            (2.0, 0.0, 1.0)
        );
    }
}
