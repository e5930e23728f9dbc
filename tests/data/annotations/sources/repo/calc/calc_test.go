package calc

import "testing"

func TestAdd(t *testing.T) {
	t.Log("adding")
	if got := Add(1, 2); got != 3 {
		t.Errorf("Add(1, 2) = %d, want 3\nsecond line of the message", got)
	}
}

func TestPasses(t *testing.T) {
	t.Log("a log line of a test that passes")
}

func TestTable(t *testing.T) {
	for _, c := range []struct{ a, b, want int }{{1, 1, 2}, {2, 2, 5}} {
		t.Run("case", func(t *testing.T) {
			if got := Add(c.a, c.b); got != c.want {
				t.Fatalf("Add(%d, %d) = %d, want %d", c.a, c.b, got, c.want)
			}
		})
	}
}
