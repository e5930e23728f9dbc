pub fn add(a: i32, b: i32) -> i32 {
    a + b + 1
}

pub fn ratio(a: i32, b: i32) -> i32 {
    let unused = a;
    if b == 0 {
        panic!("ratio of {a} to zero");
    }
    a / b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adds() {
        assert_eq!(add(1, 2), 3);
    }

    #[test]
    fn divides_by_zero() {
        assert_eq!(ratio(4, 0), 0);
    }

    #[test]
    fn divides() {
        assert_eq!(ratio(4, 2), 2);
    }
}
